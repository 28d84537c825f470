"""Bookings a layout change took the devices from: moved to an equal device, or ended with the reason "layout".

The portal never repartitions, but admins do (mig-parted), and a GPU's MIG instances come back with new uuids when
they are made again (after a reboot, mig-parted creates them anew). A reservation holding an instance that vanished,
or a whole GPU that has entered MIG mode (its instances are booked now, not the GPU), holds nothing usable. Each
such booking is moved, allocation by allocation, to a device that gives the same (an instance of the same profile,
or a whole exclusive GPU, of the same model and pool; on the same GPU first, then the same node, then any), free for the
rest of the booking; where one allocation cannot move, the reservation is cancelled (not started) or released
(running) for the portal, `released_reason` "layout", as a release by its holder would be (the unused quota given
back, a `reservation.released` event for webhooks and mail).

When: right after the registration that changed the layout commits (`layout.py`'s guard), and on the lifecycle
tick, which also catches a booking that was being written while the layout changed.

Locks: the reservation's row (skipped when another writer holds it: the next tick looks again) and, for each
device tried, its booking lock taken without waiting (`pg_try_advisory_xact_lock`: a busy device is skipped, so
this takes no lock out of the package's order). The exclusion constraint stays the last guard. The same model and
profile has the same price, so the quota hold does not change."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.audit.services import audit_record
from apps.booking import hooks
from apps.booking.models import Allocation, Reservation, ReservationStatus
from apps.booking.services.agents import send_holds
from apps.booking.services.conflicts import held_sql
from apps.booking.services.locks import GPU_LOCK_NAMESPACE
from apps.booking.services.reservations import reservation_release_by_portal
from apps.fleet.models import DeviceKind, Gpu, GpuStatus

logger = logging.getLogger(__name__)

REASON = "layout"

# A device holds nothing usable when it is a part that was retired (its layout dropped it) or a whole GPU now in
# MIG mode. Driven from the devices (few) to their live allocations (the (gpu, end) index).
_STRANDED_SQL = """
SELECT DISTINCT a.reservation_id
FROM fleet_gpu d JOIN booking_allocation a ON a.gpu_id = d.id
WHERE ((d.parent_id IS NOT NULL AND d.retired_at IS NOT NULL) OR (d.parent_id IS NULL AND d.mig_mode))
  AND a.active AND a.kind = 'reservation' AND a."end" > %s {devices}
ORDER BY a.reservation_id
LIMIT %s
"""


def stranded_reservations(*, now: datetime, device_ids: list[int] | None = None, limit: int = 200) -> list[int]:
    """Reservations with a live allocation on a device that holds nothing usable (optionally only these devices)."""
    devices = "AND d.id = ANY(%s)" if device_ids is not None else ""
    params: list[datetime | int | list[int]] = [now, *([device_ids] if device_ids is not None else []), limit]
    with connection.cursor() as cursor:
        cursor.execute(_STRANDED_SQL.format(devices=devices), params)
        return [int(r[0]) for r in cursor.fetchall()]


@dataclass(frozen=True)
class Outcome:
    reservation_id: int
    moved: dict[str, str]  # old device uuid -> new device uuid
    ended: bool


def _unusable(gpu: Gpu) -> bool:
    return (gpu.parent_id is not None and gpu.retired_at is not None) or (gpu.parent_id is None and gpu.mig_mode)


def _candidates(old: Gpu, taken: set[int]) -> list[Gpu]:
    """Devices that give what `old` gave, the nearest first (the same GPU, then the same node)."""
    model_id = old.parent.model_id if old.parent_id is not None and old.parent else old.model_id
    if old.parent_id is not None and old.kind == DeviceKind.MIG:
        qs = Gpu.devices.filter(
            kind=DeviceKind.MIG,
            mig_profile=old.mig_profile,
            parent__mig_mode=True,
            parent__retired_at__isnull=True,
            parent__model_id=model_id,
        )
    elif old.parent_id is not None:  # a share: one of the same size on a GPU of the same model
        qs = Gpu.devices.filter(
            kind=DeviceKind.SHARE,
            capacity=old.capacity,
            parent__mig_mode=False,
            parent__retired_at__isnull=True,
            parent__model_id=model_id,
        )
    else:  # a whole GPU: another exclusive one of the model
        qs = Gpu.objects.filter(model_id=model_id, mig_mode=False, shares=1)
    # In the same pool: another pool's GPUs are another scheduler's (a Slurm pool mirrors its own bookings).
    pool = old.node.pool_id
    same_pool = Q(node__pool__isnull=True) if pool is None else Q(node__pool_id=pool)
    qs = qs.filter(same_pool, retired_at__isnull=True, status=GpuStatus.OK)
    found = list(qs.exclude(pk__in=taken).select_related("parent"))
    parent = old.parent_id or old.pk

    def nearness(g: Gpu) -> tuple[int, int, int]:
        return (0 if (g.parent_id or g.pk) == parent else 1, 0 if g.node_id == old.node_id else 1, g.pk)

    return sorted(found, key=nearness)


def _free(gpu_id: int, start: datetime, end: datetime) -> bool:
    """Take the device's booking lock without waiting, then whether nothing holds it in [start, end)."""
    held = held_sql(gpu="%(gpu)s", start="%(start)s", end="%(end)s")
    # Only this package's SQL is formatted in; every value is a parameter.
    sql = f"SELECT pg_try_advisory_xact_lock(%(ns)s, %(gpu)s::int) AND NOT {held}"
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ns": GPU_LOCK_NAMESPACE, "gpu": gpu_id, "start": start, "end": end})
        row = cursor.fetchone()
    return bool(row and row[0])


def _move(allocation: Allocation, to: Gpu, now: datetime) -> bool:
    """The allocation, from `now` on, on `to` instead; False (nothing changed) if the constraint refuses it."""
    try:
        with transaction.atomic():
            if allocation.start >= now:
                Allocation.objects.filter(pk=allocation.pk).update(gpu=to)
            else:  # the part already used stays on the old device, for the record and the bill
                Allocation.objects.filter(pk=allocation.pk).update(end=now, ended_at=now)
                Allocation.objects.create(
                    gpu=to,
                    team_id=allocation.team_id,
                    user_id=allocation.user_id,
                    kind=allocation.kind,
                    reservation_id=allocation.reservation_id,
                    start=now,
                    end=allocation.end,
                )
    except IntegrityError:
        return False
    return True


def _what(gpu: Gpu) -> str:
    whole = gpu.parent if gpu.parent_id is not None and gpu.parent else gpu
    model = whole.model.name
    if gpu.kind == DeviceKind.MIG:
        return f"a {gpu.mig_profile} instance ({model})"
    if gpu.kind == DeviceKind.SHARE:
        return f"{gpu.capacity.normalize()} of a GPU ({model})"
    return f"a whole GPU ({model})"


def _why(stuck: list[Allocation]) -> str:
    held = ", ".join(sorted({_what(a.gpu) for a in stuck}))
    return (
        f"The MIG layout of the GPU it held changed (its admin repartitioned it), and no free device gives {held} "
        "for the rest of this booking; book again to get one of the GPU's new instances or another GPU."
    )


def reservation_rehome(*, reservation_id: int, now: datetime | None = None) -> Outcome | None:
    """Move a reservation's stranded allocations, or end it (see the module docstring). None when it has none (or
    its row is busy: the next tick looks again)."""
    now = now or timezone.now()
    with transaction.atomic():
        reservation = (
            Reservation.objects.select_for_update(skip_locked=True)
            .filter(pk=reservation_id, status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE], end__gt=now)
            .first()
        )
        if reservation is None:
            return None
        live = list(
            Allocation.objects.filter(reservation=reservation, active=True, end__gt=now).select_related(
                "gpu__model", "gpu__node", "gpu__parent__model"
            )
        )
        stuck = [a for a in live if _unusable(a.gpu)]
        if not stuck:
            return None
        taken = {a.gpu_id for a in live}
        moved: dict[str, str] = {}
        with transaction.atomic():  # every stuck allocation moves, or none does
            for allocation in stuck:
                target = next(
                    (
                        g
                        for g in _candidates(allocation.gpu, taken)
                        if _free(g.pk, max(allocation.start, now), allocation.end)
                    ),
                    None,
                )
                if target is None or not _move(allocation, target, now):
                    transaction.set_rollback(True)
                    moved = {}
                    break
                taken.add(target.pk)
                moved[allocation.gpu.uuid] = target.uuid
        if moved:
            audit_record(
                actor=None, action="reservation.move", target=reservation, data={"moves": moved, "reason": REASON}
            )
            if reservation.status == ReservationStatus.ACTIVE:
                send_holds(reservation.pk)
            held = ", ".join(sorted({_what(a.gpu) for a in stuck}))
            said = f"The MIG layout of the GPU it held changed; it holds {held} again, on another device."
            _tell(reservation, ended=False, message=said, moved=moved)
            return Outcome(reservation_id=reservation.pk, moved=moved, ended=False)
    # Nothing free gives it: end it in a transaction of its own, in the order a release by its holder takes locks.
    with transaction.atomic():
        ended = reservation_release_by_portal(
            reservation_id=reservation_id,
            reason=REASON,
            data={"devices": [a.gpu.uuid for a in stuck]},
            now=now,
            cancel_unstarted=True,
            message=_why(stuck),
        )
        if ended is not None:
            _tell(ended, ended=True, message=_why(stuck))
    return None if ended is None else Outcome(reservation_id=reservation_id, moved={}, ended=True)


def _tell(reservation: Reservation, *, ended: bool, message: str, moved: dict[str, str] | None = None) -> None:
    """The reservation-rehomed hooks, after commit (the efficiency app tells the holder's open pages)."""
    event = hooks.ReservationRehomed(
        reservation_id=reservation.pk,
        team_id=reservation.team_id,
        user_id=reservation.user_id,
        ended=ended,
        message=message,
        moved=dict(moved or {}),
    )
    transaction.on_commit(lambda: hooks.on_reservation_rehomed(event))


def reservations_rehome_stranded(
    *, now: datetime | None = None, device_ids: list[int] | None = None
) -> dict[str, list[int]]:
    """`reservation_rehome` for every stranded reservation (of these devices); what moved and what ended."""
    now = now or timezone.now()
    out: dict[str, list[int]] = {"moved": [], "ended": []}
    for rid in stranded_reservations(now=now, device_ids=device_ids):
        outcome = reservation_rehome(reservation_id=rid, now=now)
        if outcome is not None:
            out["ended" if outcome.ended else "moved"].append(rid)
    if out["moved"] or out["ended"]:
        logger.info("layout change: moved reservations %s, ended %s", out["moved"], out["ended"])
    return out
