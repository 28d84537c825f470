"""Writes for the parts of GPUs: the N equal shares an admin splits a GPU into, and the MIG instances its node agent
reports. Each part is a `Gpu` row with `parent` set (see the model), so allocations, the exclusion constraint and
the ledger hold it like a GPU; `Gpu.objects` leaves parts out of every list of physical GPUs.

Locks: the physical GPU's row (`SELECT ... FOR UPDATE`), then its parts'."""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_DOWN, Decimal
from fractions import Fraction

from django.db import transaction
from django.utils import timezone

from apps.accounts.types import AnyUser
from apps.audit.services import audit_record
from apps.core.errors import Conflict, ValidationFailed
from apps.fleet.models import DeviceKind, Gpu
from workers.gpu.mig import MigDevice, profile_fraction

MAX_SHARES = 16
_CAPACITY_PLACES = Decimal("0.000001")


MigInstance = MigDevice  # one MIG instance as the agent reports it


def share_uuid(parent_uuid: str, index: int) -> str:
    """The device id of share `index` of a GPU. Containers and processes get the parent's uuid (a share is not a
    device of its own to the driver); this id only names the share in the portal."""
    return f"{parent_uuid}/share-{index}"


def _capacity(fraction: float | Decimal) -> Decimal:
    return Decimal(fraction).quantize(_CAPACITY_PLACES)


def share_capacity(shares: int, index: int) -> Decimal:
    """The capacity of share `index` of a GPU split in `shares`: 1/N to 6 places, the rounding remainder spread
    over the first shares (largest remainder), so the N shares add up to exactly 1. A holder of every share is then
    billed and counted against its quota as one whole GPU: in 3, 0.333334 + 2 x 0.333333, not 3 x 0.333333."""
    base = (Decimal(1) / shares).quantize(_CAPACITY_PLACES, ROUND_DOWN)
    left = int((1 - base * shares) / _CAPACITY_PLACES)
    return base + _CAPACITY_PLACES if index < left else base


def _has_future_allocations(gpu_ids: list[int], now: datetime) -> bool:
    # Read through the relation name, not booking's model: fleet sits below booking in the import graph.
    return Gpu.devices.filter(pk__in=gpu_ids, allocations__active=True, allocations__end__gt=now).exists()


def parts_of(gpu: Gpu, *, kind: str | None = None) -> list[Gpu]:
    """The live parts of a physical GPU (shares or MIG instances), in index order."""
    qs = Gpu.devices.filter(parent=gpu, retired_at__isnull=True)
    if kind is not None:
        qs = qs.filter(kind=kind)
    return list(qs.order_by("kind", "index"))


def gpu_set_shares(*, actor: AnyUser | None, gpu_uuid: str, shares: int) -> Gpu:
    """Split a GPU into `shares` equal shares (1: exclusive again). 400 for a count out of range or a GPU in MIG
    mode; 409 while the GPU or one of its shares is held now or later (the holders would straddle two layouts)."""
    if not 1 <= shares <= MAX_SHARES:
        raise ValidationFailed(f"shares is 1..{MAX_SHARES}.", fields={"shares": [f"1 to {MAX_SHARES}."]})
    now = timezone.now()
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().get(uuid=gpu_uuid)
        if gpu.mig_mode and shares > 1:
            raise ValidationFailed("A GPU in MIG mode is shared by its instances.", fields={"shares": ["MIG mode."]})
        old = parts_of(gpu, kind=DeviceKind.SHARE)
        if gpu.shares == shares and len(old) == (shares if shares > 1 else 0):
            return gpu
        if _has_future_allocations([gpu.pk, *(p.pk for p in old)], now):
            raise Conflict("This GPU is held now or later; change its shares when nothing holds it.")
        Gpu.devices.filter(pk__in=[p.pk for p in old]).update(retired_at=now)
        if shares > 1:
            for i in range(shares):
                uuid = share_uuid(gpu.uuid, i)
                Gpu.devices.update_or_create(
                    uuid=uuid,
                    defaults={
                        "node": gpu.node,
                        "index": i,
                        "model": gpu.model,
                        "memory_mib": gpu.memory_mib // shares,
                        "capacity": share_capacity(shares, i),
                        "kind": DeviceKind.SHARE,
                        "parent": gpu,
                        "status": gpu.status,
                        "name": f"{gpu.name or gpu.model.name} share {i + 1}/{shares}",
                        "retired_at": None,
                    },
                )
        previous = gpu.shares
        gpu.shares = shares
        gpu.save(update_fields=["shares"])
        audit_record(actor=actor, action="gpu.shares", target=gpu, data={"from": previous, "to": shares})
    return gpu


def mig_layout_apply(*, gpu: Gpu, mig_mode: bool, instances: list[MigInstance], now: datetime | None = None) -> bool:
    """Make a GPU's MIG instance rows match what its agent reports (call with the GPU's row locked, inside the
    caller's transaction). Instances are keyed by uuid; one that vanished is retired (kept for the ledger).
    Returns whether anything changed. The portal never repartitions: a changed layout is taken as it is."""
    now = now or timezone.now()
    live = {p.uuid: p for p in parts_of(gpu, kind=DeviceKind.MIG)}
    reported = {i.uuid: i for i in instances} if mig_mode else {}
    order = sorted(reported.values(), key=lambda i: (i.gi_id, i.uuid))
    target = {inst.uuid: n for n, inst in enumerate(order)}
    # Rows that vanished or move to another index leave the (parent, kind, index) uniqueness first, so instances
    # may trade places; the ones that stay come back below.
    moving = [p.pk for uuid, p in live.items() if target.get(uuid) != p.index]
    if moving:
        Gpu.devices.filter(pk__in=moving).update(retired_at=now)
    changed = bool(moving)
    for n, inst in enumerate(order):
        try:
            fraction = profile_fraction(inst.profile)
        except ValueError:  # a profile this table does not know: priced by its memory
            fraction = Fraction(min(inst.memory_mib, gpu.memory_mib), max(gpu.memory_mib, 1))
        fields = {
            "node_id": gpu.node_id,
            "index": n,
            "model_id": gpu.model_id,
            "memory_mib": inst.memory_mib,
            "capacity": _capacity(Decimal(fraction.numerator) / Decimal(fraction.denominator)),
            "kind": DeviceKind.MIG,
            "parent_id": gpu.pk,
            "mig_profile": inst.profile,
            "gi_id": inst.gi_id,
            "status": gpu.status,
            "name": f"{gpu.name or gpu.model.name} MIG {inst.profile}",
            "retired_at": None,
        }
        row = live.get(inst.uuid)
        if row is not None and row.pk not in moving and all(getattr(row, k) == v for k, v in fields.items()):
            continue
        Gpu.devices.update_or_create(uuid=inst.uuid, defaults=fields)
        changed = True
    return changed


def parts_sync_status(*, gpu_ids: list[int], status: str) -> None:
    """Parts follow their GPU's status (booking checks the GPU's, pages show the part's)."""
    Gpu.devices.filter(parent_id__in=gpu_ids, retired_at__isnull=True).exclude(status=status).update(status=status)
