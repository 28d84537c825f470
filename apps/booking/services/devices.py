"""Which parts of GPUs a booking of a MIG profile or of a GPU share takes, and what a whole-GPU booking of a shared
or MIG-mode GPU means.

A part (MIG instance or share) is a `Gpu` row with a parent, so the booking is written exactly like one of whole
GPUs (`reservations._book`): the parts' advisory locks, the clash-guarded insert, the exclusion constraint per
part. Placement runs under the placement lock of the GPU model (as whole GPUs by model do), so concurrent requests
for the same profile or share pick from what the others left, and the winners are exactly as many as the parts.
A whole-GPU booking of a shared GPU holds all its shares (so it waits until all are free, and blocks them all);
a GPU in MIG mode is booked only by its instances.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.booking.placement import FreeUnit, place_instances, place_share, shares_needed
from apps.booking.services.conflicts import clashes, describe_slots, held_sql
from apps.booking.services.gpus import OUTSIDE_USE_HORIZON, GpuInfo, gpus_by_uuid
from apps.booking.services.locks import lock_model
from apps.core.errors import Conflict, ValidationFailed
from apps.fleet.models import DeviceKind, GpuModel, GpuStatus, NodeStatus
from apps.fleet.selectors import released_within
from apps.telemetry import keys
from apps.telemetry.selectors import is_stale, latest_samples
from workers.gpu.mig import all_profile_names, is_profile_name

# Every live part of the kind asked, of GPUs that can be booked, with whether it is taken in [start, end): the part
# held, its GPU held whole, or a maintenance window on the GPU, its node or the fleet.
_UNITS_SQL = """
SELECT u.id, u.uuid, u."index", u.node_id, n.name, n.status, p.status, m.id, m.name, m.hourly_price,
       u.parent_id, p.uuid, u.mig_profile, u.capacity, p.shares, p."index",
       {held_unit} OR {held_parent}
       OR EXISTS (SELECT 1 FROM booking_maintenancewindow w WHERE w.start < %(end)s AND w."end" > %(start)s
                  AND (w.gpu_id = p.id OR w.node_id = p.node_id OR (w.gpu_id IS NULL AND w.node_id IS NULL)))
FROM fleet_gpu u JOIN fleet_gpu p ON p.id = u.parent_id
     JOIN fleet_node n ON n.id = p.node_id JOIN fleet_gpumodel m ON m.id = p.model_id
WHERE u.kind = %(kind)s AND u.retired_at IS NULL AND p.retired_at IS NULL
  AND (%(kind)s = 'mig' AND p.mig_mode AND u.mig_profile = %(profile)s
       OR %(kind)s = 'share' AND NOT p.mig_mode AND p.shares > 1)
  AND (%(model)s::bigint IS NULL OR p.model_id = %(model)s::bigint)
  AND (cardinality(%(uuids)s::text[]) = 0 OR p.uuid = ANY(%(uuids)s::text[]) OR u.uuid = ANY(%(uuids)s::text[]))
  AND CASE WHEN %(include_offline)s THEN p.status <> %(lost)s ELSE p.status = %(ok)s AND n.status = %(online)s END
ORDER BY n.name, p."index", u."index"
""".replace("{held_unit}", held_sql(gpu="u.id", start="%(start)s", end="%(end)s")).replace(
    "{held_parent}", held_sql(gpu="p.id", start="%(start)s", end="%(end)s")
)


# The MIG profiles of live instances with at least %(min)s MiB of memory (of the model or GPUs asked), smallest first:
# "any instance with at least N MiB" tries them in this order, so a small job takes a small instance. A compute
# instance that is part of its GPU instance ("1c.3g.40gb") is left out: its memory is shared with its siblings.
_PROFILES_SQL = """
SELECT u.mig_profile FROM fleet_gpu u JOIN fleet_gpu p ON p.id = u.parent_id
WHERE u.kind = 'mig' AND u.retired_at IS NULL AND p.retired_at IS NULL AND p.mig_mode AND u.memory_mib >= %(min)s
  AND position('c.' in u.mig_profile) = 0
  AND (%(model)s::bigint IS NULL OR p.model_id = %(model)s::bigint)
  AND (cardinality(%(uuids)s::text[]) = 0 OR p.uuid = ANY(%(uuids)s::text[]) OR u.uuid = ANY(%(uuids)s::text[]))
GROUP BY u.mig_profile ORDER BY MIN(u.memory_mib), u.mig_profile
"""
MAX_INSTANCE_MEMORY_MIB = 1 << 24  # 16 TiB: far above any GPU, low enough to stay an int everywhere


def parse_memory(value: Any) -> int:
    """A `mig_memory_mib` (the least memory an instance must have) as a positive int; 400 otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INSTANCE_MEMORY_MIB:
        raise ValidationFailed(
            "mig_memory_mib is the least memory of the MIG instance, in MiB: a positive whole number.",
            fields={"mig_memory_mib": [f"1 to {MAX_INSTANCE_MEMORY_MIB}."]},
        )
    return value


def profiles_with_memory(min_mib: int, *, model_id: int | None = None, uuids: Sequence[str] = ()) -> list[str]:
    """The profiles of the fleet's MIG instances with at least `min_mib` MiB, smallest first; 400 when none has."""
    with connection.cursor() as cursor:
        cursor.execute(_PROFILES_SQL, {"min": min_mib, "model": model_id, "uuids": list(uuids)})
        found = [str(r[0]) for r in cursor.fetchall()]
    if not found:
        raise ValidationFailed(
            f"No MIG instance in the fleet has {min_mib} MiB of memory or more.",
            fields={"mig_memory_mib": ["More than any MIG instance has."]},
        )
    return found


def share_text(share: Decimal) -> str:
    """A share as people write it: 0.3, not 0.300000 (the column's scale)."""
    return format(share.normalize(), "f")


# What the layout offers, of the GPUs asked (a model, GPUs or parts named, or the whole fleet): the profiles of live
# MIG instances, and the splits of live shared GPUs.
_LAYOUT_PROFILES_SQL = """
SELECT DISTINCT u.mig_profile FROM fleet_gpu u JOIN fleet_gpu p ON p.id = u.parent_id
WHERE u.kind = 'mig' AND u.retired_at IS NULL AND p.retired_at IS NULL AND p.mig_mode
  AND (cardinality(%(models)s::text[]) = 0
       OR p.model_id IN (SELECT m.id FROM fleet_gpumodel m WHERE m.name = ANY(%(models)s::text[])))
  AND (cardinality(%(uuids)s::text[]) = 0 OR p.uuid = ANY(%(uuids)s::text[]) OR u.uuid = ANY(%(uuids)s::text[]))
ORDER BY 1
"""
_LAYOUT_SPLITS_SQL = """
SELECT DISTINCT p.shares FROM fleet_gpu p
WHERE p.parent_id IS NULL AND p.retired_at IS NULL AND NOT p.mig_mode AND p.shares > 1
  AND (cardinality(%(models)s::text[]) = 0
       OR p.model_id IN (SELECT m.id FROM fleet_gpumodel m WHERE m.name = ANY(%(models)s::text[])))
  AND (cardinality(%(uuids)s::text[]) = 0 OR p.uuid = ANY(%(uuids)s::text[])
       OR EXISTS (SELECT 1 FROM fleet_gpu u WHERE u.parent_id = p.id AND u.uuid = ANY(%(uuids)s::text[])))
ORDER BY 1
"""


def check_part_in_fleet(
    *, mig_profile: str | None, gpu_share: Decimal | None, models: Sequence[str] = (), uuids: Sequence[str] = ()
) -> None:
    """400 for a part the GPUs asked (of the `models` named, the GPUs or parts named in `uuids`, or else the whole
    fleet) do not give as they are laid out now: a MIG profile no live instance has, or a share that is not a whole
    number of any split GPU's shares. A job would only wait until an admin changes the layout, and a booking could
    only fail."""
    if uuids:
        where = "among the GPUs named"
    elif models:
        where = f"of model {'|'.join(models)}"
    else:
        where = "in the fleet"
    params = {"models": list(models), "uuids": list(uuids)}
    with connection.cursor() as cursor:
        if mig_profile:
            cursor.execute(_LAYOUT_PROFILES_SQL, params)
            profiles = [str(r[0]) for r in cursor.fetchall()]
            if mig_profile not in profiles:
                there = f"instances: {', '.join(profiles)}" if profiles else "no GPU in MIG mode"
                raise ValidationFailed(
                    f"No MIG instance of profile {mig_profile!r} {where} ({there}).",
                    fields={"mig_profile": [f"None {where} ({there})."]},
                )
        if gpu_share is not None and gpu_share < 1:
            cursor.execute(_LAYOUT_SPLITS_SQL, params)
            splits = [int(r[0]) for r in cursor.fetchall()]
            if not splits:
                raise ValidationFailed(
                    f"No GPU {where} is split in shares: ask for whole GPUs or a MIG instance.",
                    fields={"gpu_share": [f"No GPU {where} is split in shares."]},
                )
            if all(shares_needed(gpu_share, s) is None for s in splits):
                raise _not_whole_shares(gpu_share, splits)


def _not_whole_shares(gpu_share: Decimal, splits: Sequence[int]) -> ValidationFailed:
    names = ", ".join(f"1/{s}" for s in splits)
    return ValidationFailed(
        f"No GPU is split so that {share_text(gpu_share)} of it is a whole number of shares (splits: {names}).",
        fields={"gpu_share": [f"A multiple of one of: {names}."]},
    )


def parse_share(value: Any) -> Decimal:
    """A `gpu_share` as a Decimal in (0, 1]; 400 otherwise."""
    try:
        share = Decimal(str(value))
    except (InvalidOperation, ValueError):
        share = Decimal(-1)
    if not share.is_finite() or not Decimal(0) < share <= Decimal(1):
        raise ValidationFailed(
            "gpu_share is a fraction of one GPU, above 0 and at most 1.", fields={"gpu_share": ["0 < share <= 1."]}
        )
    return share


def check_profile(profile: str) -> None:
    """400 for a profile NVIDIA does not define for any model the portal knows (or a compute instance of one)."""
    if not is_profile_name(profile):
        raise ValidationFailed(
            f"Unknown MIG profile {profile!r}.",
            fields={
                "mig_profile": [
                    f"One of: {', '.join(sorted(all_profile_names()))}; or a compute instance of one, "
                    "such as 1c.3g.40gb."
                ]
            },
        )


def _unit_info(r: Sequence[Any]) -> tuple[GpuInfo, int, int]:
    capacity = Decimal(r[13])
    info = GpuInfo(
        id=r[0], uuid=r[1], index=r[2], node_id=r[3], node=r[4], node_status=r[5], status=r[6], model_id=r[7],
        model=r[8], hourly_price=(Decimal(r[9]) * capacity).quantize(Decimal("0.0001")), kind=DeviceKind.MIG
        if r[12] else DeviceKind.SHARE, profile=r[12] or None, share=capacity, parent_uuid=r[11], parent_id=r[10],
        parent_index=r[15],
    )  # fmt: skip
    return info, int(r[10]), int(r[14])


def _units(
    *,
    kind: str,
    profile: str,
    model_id: int | None,
    uuids: Sequence[str],
    start: datetime,
    end: datetime,
    include_offline: bool,
) -> list[tuple[GpuInfo, int, int, bool]]:
    params = {
        "kind": kind,
        "profile": profile,
        "model": model_id,
        "uuids": list(uuids),
        "start": start,
        "end": end,
        "include_offline": include_offline,
        "lost": GpuStatus.LOST.value,
        "ok": GpuStatus.OK.value,
        "online": NodeStatus.ONLINE.value,
    }
    with connection.cursor() as cursor:
        cursor.execute(_UNITS_SQL, params)
        rows = cursor.fetchall()
    return [(*_unit_info(r), bool(r[16])) for r in rows]


def _in_use_outside(free: Sequence[tuple[GpuInfo, int]], shares: Mapping[int, int], start: datetime) -> dict[int, int]:
    """The free parts whose memory something outside the portal uses now (id -> MiB used), for a booking or job that
    starts now (placement.FreeUnit): a MIG instance whose own reading shows it, a share of a GPU none of whose
    shares is held (`shares`: each GPU's count) whose GPU's reading does; neither on a GPU the portal released a
    part of in the last minute. One Redis read; a query only when some part is so used."""
    if not free or start > timezone.now() + OUTSIDE_USE_HORIZON:
        return {}
    samples = latest_samples({info.parent_uuid for info, _ in free if info.parent_uuid})
    now = time.time()
    free_of = Counter(parent for _, parent in free)
    found: dict[int, tuple[int, int]] = {}  # part id -> (its GPU's id, MiB used)
    for info, parent in free:
        sample = samples.get(info.parent_uuid or "")
        if sample is None or is_stale(sample, now=now):
            continue
        if info.kind == DeviceKind.MIG:
            used = (sample.get("mig_mem") or {}).get(info.uuid)
        else:  # a share: what the GPU uses is outside the portal only while the portal holds none of it
            used = sample.get("mem_used") if free_of[parent] >= shares.get(parent, 0) else None
        if used is not None and used >= keys.OUTSIDE_USE_MIB:
            found[info.id] = (parent, int(used))
    if not found:
        return {}
    released = released_within({parent for parent, _ in found.values()}, seconds=keys.OUTSIDE_GRACE_S)
    return {part: mib for part, (parent, mib) in found.items() if parent not in released}


def _model_ids(model: GpuModel | None, uuids: Sequence[str]) -> list[int]:
    """The placement locks to take: the model asked, or the models of the GPUs (or parts) named."""
    if model is not None:
        return [model.pk]
    if not uuids:
        # Any model: every model that has parts, in id order (as every caller takes them), so concurrent requests
        # pick from what the others left rather than all reaching for the first free part and retrying.
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT p.model_id FROM fleet_gpu p WHERE p.parent_id IS NOT NULL ORDER BY 1")
            return [int(r[0]) for r in cursor.fetchall()]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT model_id FROM fleet_gpu WHERE uuid = ANY(%s::text[]) ORDER BY model_id", [list(uuids)]
        )
        return [int(r[0]) for r in cursor.fetchall()]


def place_parts_locked(
    *,
    team: Team,
    user: AnyUser | None,
    model: GpuModel | None,
    uuids: Sequence[str],
    mig_profile: str | None,
    gpu_share: Decimal | None,
    count: int,
    start: datetime,
    end: datetime,
    include_offline: bool = False,
    mig_memory_mib: int | None = None,
    exclude: Collection[int] = (),
    explain: bool = True,
) -> list[GpuInfo]:
    """The parts a booking of `count` instances of `mig_profile` (or, with `mig_memory_mib`, of the smallest profile
    with that much memory that has them free), or of `gpu_share` of one GPU, takes (inside the caller's transaction,
    under the placement locks of the models involved); 409 `conflict` when none fit. Parts in `exclude` count as
    taken (the scheduler's plan for a job ahead in the queue). Without `explain` the 409 names no clashing slots
    (the scheduler tries many windows and reads none of them; each costs a query)."""
    for locked in _model_ids(model, uuids):
        lock_model(locked)
    model_id = model.pk if model is not None else None
    if mig_memory_mib is not None:
        profiles = profiles_with_memory(mig_memory_mib, model_id=model_id, uuids=uuids)
    else:
        profiles = [mig_profile] if mig_profile else []
    kind = DeviceKind.MIG if profiles else DeviceKind.SHARE
    rows: list[tuple[GpuInfo, int, int, bool]] = []
    seen: list[tuple[GpuInfo, int, int, bool]] = []  # every profile tried, for the refusal's conflicts
    picked: list[int] | None = None
    for profile in profiles or [""]:
        rows = _units(
            kind=kind,
            profile=profile,
            model_id=model_id,
            uuids=uuids,
            start=start,
            end=end,
            include_offline=include_offline,
        )
        seen.extend(rows)
        free = [(info, parent) for info, parent, _, taken in rows if not taken and info.id not in exclude]
        outside = _in_use_outside(free, {parent: shares for _, parent, shares, _ in rows}, start)
        units = [FreeUnit(info.id, parent, info.node, info.index, info.id in outside) for info, parent in free]
        if not profiles:
            break
        picked = place_instances(units, count)
        if picked is not None:
            break
    if profiles:
        what = f"{count} free {'/'.join(profiles)} instance(s)"
    else:
        assert gpu_share is not None
        picked = None
        totals: dict[int, int] = {}
        for _, parent, shares, _ in rows:
            totals[parent] = shares
        # The share asked must be a whole number of one GPU's shares: try the GPUs by their split.
        splits = sorted(set(totals.values()))
        for split in splits:
            need = shares_needed(gpu_share, split)
            if need is None:
                continue
            picked = place_share([u for u in units if totals.get(u.parent) == split], need, totals)
            if picked is not None:
                break
        if picked is None and rows and all(shares_needed(gpu_share, s) is None for s in splits):
            raise _not_whole_shares(gpu_share, splits)
        what = f"{share_text(gpu_share)} of a shared GPU"
    if picked is None:
        found = clashes([info.id for info, _, _, _ in seen], start, end) if explain else []
        raise Conflict(
            f"Nothing fitting is free in that time ({what} asked, {len(free)} part(s) free).",
            extra={"conflicts": describe_slots(found, team_id=team.pk, viewer=user), "free": len(free)},
        )
    by_id = {info.id: info for info, _ in free}
    return [replace(by_id[i], in_use_outside_mib=outside[i]) if i in outside else by_id[i] for i in picked]


def free_part_count(
    *, model: GpuModel, mig_profile: str | None, gpu_share: Decimal | None, start: datetime, end: datetime
) -> int:
    """How many of a slice are free in [start, end): instances of `mig_profile`, or how many times `gpu_share` of one
    GPU could be booked side by side (a GPU split in four with three shares free holds one half, not one and a
    half). A read, for telling a waiting member how much there is; booking itself places under the model's lock."""
    kind = DeviceKind.MIG if mig_profile else DeviceKind.SHARE
    rows = _units(
        kind=kind, profile=mig_profile or "", model_id=model.pk, uuids=[], start=start, end=end, include_offline=False
    )
    if mig_profile:
        return sum(1 for _, _, _, taken in rows if not taken)
    assert gpu_share is not None
    free: dict[int, int] = {}
    split: dict[int, int] = {}
    for _, parent, shares, taken in rows:
        split[parent] = shares
        free[parent] = free.get(parent, 0) + (0 if taken else 1)
    total = 0
    for parent, n in free.items():
        need = shares_needed(gpu_share, split[parent])
        total += n // need if need else 0
    return total


_SPLIT_SQL = """
SELECT p.uuid, p.mig_mode, p.shares,
       ARRAY(SELECT u.uuid FROM fleet_gpu u WHERE u.parent_id = p.id AND u.kind = 'share' AND u.retired_at IS NULL
             ORDER BY u."index"),
       ARRAY(SELECT u.capacity FROM fleet_gpu u WHERE u.parent_id = p.id AND u.kind = 'share' AND u.retired_at IS NULL
             ORDER BY u."index")
FROM fleet_gpu p WHERE p.uuid = ANY(%s::text[]) AND p.parent_id IS NULL AND (p.mig_mode OR p.shares > 1)
"""


def whole_gpus(explicit: list[GpuInfo], start: datetime, end: datetime) -> list[GpuInfo]:
    """GPUs named for a whole-GPU booking, as the devices to hold: a shared GPU becomes all its shares (so it is
    refused while any share is held), a GPU in MIG mode is refused (400: book its instances). One query, and only
    when a GPU named is shared or in MIG mode does a second one look its shares up."""
    with connection.cursor() as cursor:
        cursor.execute(_SPLIT_SQL, [[g.uuid for g in explicit]])
        rows = cursor.fetchall()
    special = {r[0]: (bool(r[1]), int(r[2]), list(r[3])) for r in rows}
    capacity = {u: Decimal(c) for r in rows for u, c in zip(r[3], r[4], strict=True)}
    if not special:
        return explicit
    mig = [u for u, (mig_mode, _, _) in special.items() if mig_mode]
    if mig:
        raise ValidationFailed(
            f"GPU(s) in MIG mode are booked by their instances (mig_profile): {', '.join(mig)}.",
            code="mig_mode",
            fields={"gpus": [f"In MIG mode: {', '.join(mig)}."]},
        )
    share_uuids = [s for _, _, shares in special.values() for s in shares]
    parts = gpus_by_uuid(share_uuids, start, end)
    out: list[GpuInfo] = []
    for g in explicit:
        if g.uuid not in special:
            out.append(g)
            continue
        for s in special[g.uuid][2]:
            part = parts[s]
            out.append(
                replace(
                    part,
                    status=g.status,
                    # The share's own capacity and its price unrounded: the N add up to exactly one GPU and its
                    # price, which the booking holds against its quota.
                    hourly_price=g.hourly_price * capacity[s],
                    kind=DeviceKind.SHARE,
                    share=capacity[s],
                    parent_uuid=g.uuid,
                    parent_id=g.id,
                    parent_index=g.index,
                )
            )
    return out


# What holds parts (or their GPUs) after %(after)s: active allocations, and maintenance windows of a GPU, a node or
# the fleet. The scheduler plans jobs on parts from these in memory (apps/jobs/scheduler/part_plans.py).
_HOLDS_SQL = """
SELECT a.gpu_id, NULL::bigint, a.start, a."end", TRUE FROM booking_allocation a
WHERE a.active AND a."end" > %(after)s AND a.start < a."end" AND a.gpu_id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT w.gpu_id, w.node_id, w.start, w."end", FALSE FROM booking_maintenancewindow w WHERE w."end" > %(after)s
"""


@dataclass(frozen=True)
class Hold:
    """An allocation of a GPU or part (`gpu_id`), or a maintenance window (of `gpu_id`, `node_id` or, with
    neither, the fleet), over [start, end)."""

    gpu_id: int | None
    node_id: int | None
    start: datetime
    end: datetime
    allocation: bool


def live_parts(*, kind: str, profile: str, model_id: int | None, at: datetime) -> list[tuple[GpuInfo, int, int]]:
    """The live parts of `kind` (of `profile` for MIG) on bookable GPUs, as placement sees them: (part, its GPU's
    id, that GPU's number of shares)."""
    rows = _units(kind=kind, profile=profile, model_id=model_id, uuids=[], start=at, end=at, include_offline=False)
    return [(info, parent, shares) for info, parent, shares, _ in rows]


def holds_after(after: datetime, gpu_ids: Collection[int]) -> list[Hold]:
    """The allocations of `gpu_ids` and all maintenance windows that end after `after`."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLDS_SQL, {"after": after, "ids": sorted(gpu_ids)})
        return [Hold(r[0], r[1], r[2], r[3], bool(r[4])) for r in cursor.fetchall()]
