"""Which GPUs a booking takes: GPUs named by uuid (looked up with what holds them), or GPUs of a model placed under
the model's lock. Both read in one statement each; the placement itself is the pure `apps.booking.placement`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.booking.models import BookingPolicy
from apps.booking.placement import FreeGpu, place
from apps.booking.services.conflicts import (
    MAX_CONFLICTS_SHOWN,
    Slot,
    clashes,
    describe_slots,
    held_conflict,
    held_sql,
)
from apps.booking.services.locks import lock_model
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.ttlcache import TTLCache
from apps.fleet.models import DeviceKind, Gpu, GpuModel, GpuStatus, NodeStatus
from apps.fleet.selectors import released_within
from apps.telemetry import keys
from apps.telemetry.selectors import in_use_outside


@dataclass(frozen=True)
class Clash:
    """An allocation of a GPU as a conflict report shows it (a `Slot` without the GPU's own fields)."""

    team_id: int
    team: str
    start: datetime
    end: datetime
    kind: str
    reservation_id: int | None
    job_id: int | None
    user: str | None


@dataclass(frozen=True)
class GpuInfo:
    """What booking needs to know of a GPU; `busy`/`maintenance` for the window asked (None: not looked up)."""

    id: int
    uuid: str
    index: int
    node_id: int
    node: str
    node_status: str
    status: str
    model_id: int
    model: str
    hourly_price: Decimal
    busy: bool | None = None
    maintenance: bool | None = None
    # The active allocations clashing with the window asked, earliest first, at most MAX_CONFLICTS_SHOWN (None:
    # not looked up): what a 409 reports, read with the GPU instead of by a second query.
    clashes: tuple[Clash, ...] | None = None
    # A part of a GPU (services.devices): "mig" or "share", its profile, its fraction of the physical GPU and that
    # GPU. A whole GPU: kind "gpu", share 1.
    kind: str = "gpu"
    profile: str | None = None
    share: Decimal = Decimal(1)
    parent_uuid: str | None = None
    parent_id: int | None = None
    parent_index: int | None = None
    # A GPU split in shares, picked whole by model (placement_pool with `split`): booked through all its shares.
    split: bool = False
    # A part placed for a start now whose memory something outside the portal uses (MiB; services.devices), taken
    # because nothing free of such use fitted: the job's start event says so.
    in_use_outside_mib: int | None = None


# A PL/pgSQL function that keeps one generic plan per connection: PostgreSQL planned this query anew for every
# request (its estimate for a plan without the values was always the higher), which cost more than running it.
# Migration booking 0005 holds its SQL and says more. The casts let PostgreSQL pick the function without guessing.
_GPUS_SQL = (
    "SELECT * FROM portal_booking_gpus(%(uuids)s::text[], %(start)s::timestamptz, %(end)s::timestamptz, %(limit)s::int)"
)


def _clash(item: list[Any]) -> Clash:
    # json_build_array writes timestamptz in ISO 8601 with the session's offset (UTC: Django sets it).
    return Clash(
        team_id=item[0],
        team=item[1],
        start=datetime.fromisoformat(item[2]),
        end=datetime.fromisoformat(item[3]),
        kind=item[4],
        reservation_id=item[5],
        job_id=item[6],
        user=item[7],
    )


def _gpu_row(r: Sequence[Any], **looked_up: Any) -> GpuInfo:
    """GpuInfo from the first ten columns both GPU statements select (id, uuid, index, node id, node name and
    status, GPU status, model id, name and price)."""
    return GpuInfo(
        id=r[0], uuid=r[1], index=r[2], node_id=r[3], node=r[4], node_status=r[5], status=r[6], model_id=r[7],
        model=r[8], hourly_price=r[9], **looked_up,
    )  # fmt: skip


def gpus_by_uuid(uuids: Sequence[str], start: datetime, end: datetime) -> dict[str, GpuInfo]:
    """The GPUs named, with the allocations that hold each during [start, end) and whether maintenance blocks it:
    one query (a refused booking needs no second one to say what it clashed with)."""
    with connection.cursor() as cursor:
        cursor.execute(_GPUS_SQL, {"uuids": list(uuids), "start": start, "end": end, "limit": MAX_CONFLICTS_SHOWN})
        rows = cursor.fetchall()
    out: dict[str, GpuInfo] = {}
    for r in rows:
        raw = r[10]
        if isinstance(raw, str):  # psycopg loads json itself; a plain string if a loader is not registered
            raw = json.loads(raw)
        found = tuple(_clash(item) for item in raw or ())
        out[r[1]] = _gpu_row(r, busy=bool(found), maintenance=r[11], clashes=found)
    return out


# Every bookable GPU of a model with whether it is taken in [start, end) (an active allocation, found as in the
# GPU lookup, or a maintenance window), for placement: tuples, no ORM objects, one statement. With the pool loaded
# as ORM objects and the busy GPUs asked for by an IN list of all their ids, a booking by model of a large model
# spent most of its time here, all under the model's placement lock.
_POOL_SQL = """
WITH mw AS MATERIALIZED (
    SELECT w.gpu_id, w.node_id FROM booking_maintenancewindow w WHERE w.start < %(end)s AND w."end" > %(start)s
)
SELECT g.id, g.uuid, g."index", g.node_id, n.name, n.status, g.status, m.id, m.name, m.hourly_price,
       {held}
       OR EXISTS (SELECT 1 FROM mw
                  WHERE mw.gpu_id = g.id OR mw.node_id = g.node_id OR (mw.gpu_id IS NULL AND mw.node_id IS NULL))
FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id JOIN fleet_gpumodel m ON m.id = g.model_id
WHERE g.model_id = %(model)s AND g.parent_id IS NULL AND NOT g.mig_mode AND g.shares = 1
  AND CASE WHEN %(include_offline)s THEN g.status <> %(lost)s ELSE g.status = %(ok)s AND n.status = %(online)s END
ORDER BY n.name, g."index"
"""


# The same for the model's GPUs split in shares, each taken when any of its live shares is held (a split GPU is
# booked whole through all its shares: services.devices.whole_gpus).
_SPLIT_POOL_SQL = (
    _POOL_SQL.replace("g.shares = 1", "g.shares > 1")
    .replace(
        "{held}",
        "{held} OR EXISTS (SELECT 1 FROM fleet_gpu s WHERE s.parent_id = g.id AND s.kind = 'share' "
        "AND s.retired_at IS NULL AND {held_share})",
        1,
    )
    .replace("{held_share}", held_sql(gpu="s.id", start="%(start)s", end="%(end)s"))
)
_POOL_SQL = _POOL_SQL.replace("{held}", held_sql(gpu="g.id", start="%(start)s", end="%(end)s"))
_SPLIT_POOL_SQL = _SPLIT_POOL_SQL.replace("{held}", held_sql(gpu="g.id", start="%(start)s", end="%(end)s"))


def placement_pool(
    model_id: int, start: datetime, end: datetime, *, include_offline: bool = False, split: bool = False
) -> list[tuple[GpuInfo, bool]]:
    """Each bookable GPU of the model (selectors.bookable_gpus), ordered by node name and index, with whether it is
    taken in [start, end): held by an active allocation or blocked by a maintenance window. Exclusive GPUs, or with
    `split` those split in shares (taken when a share is): a GPU in MIG mode is booked by its instances only."""
    params: dict[str, Any] = {
        "model": model_id,
        "start": start,
        "end": end,
        "include_offline": include_offline,
        "lost": GpuStatus.LOST.value,
        "ok": GpuStatus.OK.value,
        "online": NodeStatus.ONLINE.value,
    }
    with connection.cursor() as cursor:
        cursor.execute(_SPLIT_POOL_SQL if split else _POOL_SQL, params)
        rows = cursor.fetchall()
    return [(replace(_gpu_row(r), split=True) if split else _gpu_row(r), bool(r[10])) for r in rows]


def resolve_model(gpu_model: str | GpuModel | None) -> GpuModel:
    """The GPU model by name; 400 naming the known ones when there is no such model."""
    if isinstance(gpu_model, GpuModel):
        return gpu_model
    model = GpuModel.objects.filter(name=gpu_model).first() if gpu_model else None
    if model is None:
        names = list(GpuModel.objects.values_list("name", flat=True))
        raise ValidationFailed(
            f"Unknown GPU model {gpu_model!r}." if gpu_model else "Name a GPU model or the GPUs.",
            fields={"gpu_model": [f"One of: {', '.join(names)}." if names else "No GPU models exist yet."]},
        )
    return model


def check_named_exist(uuids: Sequence[str]) -> None:
    """404 for uuids that name no GPU, MIG instance or share (retired ones included: they are known, not bookable)."""
    known = set(Gpu.devices.filter(uuid__in=list(uuids)).values_list("uuid", flat=True))
    unknown = [u for u in uuids if u not in known]
    if unknown:
        raise NotFound(f"Unknown GPU(s): {', '.join(unknown)}.", fields={"gpus": [f"Unknown: {', '.join(unknown)}."]})


def resolve_gpus(
    gpus: Sequence[str | Gpu], start: datetime, end: datetime, *, include_offline: bool = False
) -> list[GpuInfo]:
    """The GPUs named, in order, each with whether it is held or under maintenance in [start, end); 404 for
    unknown ones, 400 for ones that cannot be booked."""
    wanted = [g.uuid if isinstance(g, Gpu) else str(g) for g in gpus]
    if len(set(wanted)) != len(wanted):
        raise ValidationFailed("A GPU is named twice.", fields={"gpus": ["Name each GPU once."]})
    rows = gpus_by_uuid(wanted, start, end)
    unknown = [u for u in wanted if u not in rows]
    if unknown:
        raise NotFound(f"Unknown GPU(s): {', '.join(unknown)}.", fields={"gpus": [f"Unknown: {', '.join(unknown)}."]})
    if include_offline:
        down = [u for u in wanted if rows[u].status == GpuStatus.LOST]
    else:
        down = [u for u in wanted if rows[u].status != GpuStatus.OK or rows[u].node_status != NodeStatus.ONLINE]
    if down:
        raise ValidationFailed(
            f"GPU(s) not available for booking (offline, lost or node not online): {', '.join(down)}.",
            code="gpu_unavailable",
            fields={"gpus": [f"Not bookable: {', '.join(down)}."]},
        )
    return [rows[u] for u in wanted]


def _slot(gpu: GpuInfo, c: Clash) -> Slot:
    # A part (a share, a MIG instance) is reported at its physical GPU's index, as `conflicts.clashes` does.
    index = gpu.parent_index if gpu.parent_index is not None else gpu.index
    return Slot(gpu.id, gpu.uuid, index, gpu.node, c.team_id, c.team, c.start, c.end, c.kind, c.reservation_id,
                c.job_id, c.user)  # fmt: skip


def precheck(gpus: Sequence[GpuInfo], *, team: Team, user: AnyUser | None) -> None:
    """409 before any lock when a GPU from `resolve_gpus` is under maintenance or already held (the locked write
    checks again)."""
    blocked = [g for g in gpus if g.maintenance]
    if blocked:
        raise Conflict(
            "A maintenance window blocks some of these GPUs in that time.",
            extra={"conflicts": [{"gpu": g.uuid, "node": g.node, "maintenance": True} for g in blocked]},
        )
    found = [_slot(g, c) for g in gpus for c in g.clashes or ()]
    if found:
        # Ordered as `conflicts.clashes` orders them.
        ordered = sorted(found, key=lambda slot: (slot.gpu_id, slot.start))[:MAX_CONFLICTS_SHOWN]
        raise held_conflict(ordered, team_id=team.pk, viewer=user)


# What something outside the portal uses now says something about a booking that starts within minutes, nothing
# about one tomorrow.
OUTSIDE_USE_HORIZON = timedelta(minutes=5)


# Read for all of a model's GPUs at most every 10 s per web process, not under the model's lock on every booking:
# one read is ~5 ms for 1,000 GPUs (bench/outside_use.py), and what runs outside the portal changes over minutes.
_OUTSIDE = TTLCache[int, dict[str, int]](ttl_s=10.0, maxsize=256)


def _in_use_outside(model_id: int, pool: Sequence[GpuInfo], start: datetime) -> set[int]:
    """The ids of the whole GPUs of `pool` (the model's, free or not) whose memory something outside the portal uses
    now (telemetry; not one the portal released in the last minute): a booking that starts now takes them last
    (placement.FreeGpu). Nothing for a later booking; nothing when Redis cannot answer. A query only when some GPU
    is so used."""
    if start > timezone.now() + OUTSIDE_USE_HORIZON:
        return set()
    used = _OUTSIDE.get_or_set(model_id, lambda: in_use_outside(g.uuid for g in pool if not g.split))
    ids = {g.id for g in pool if g.uuid in used and not g.split}
    return ids - released_within(ids, seconds=keys.OUTSIDE_GRACE_S) if ids else set()


def place_locked(
    *,
    model: GpuModel,
    count: int,
    start: datetime,
    end: datetime,
    policy: BookingPolicy,
    team: Team,
    user: AnyUser | None,
    include_offline: bool = False,
) -> list[GpuInfo]:
    """Pick `count` free GPUs of `model` for [start, end) under the model's placement lock (inside the caller's
    transaction); 409 when there are not enough. Exclusive GPUs first; only when they cannot give the booking,
    GPUs split in shares with all their shares free (shares are what admins split them for), which the caller
    books through all their shares (services.devices.whole_gpus)."""
    lock_model(model.pk)
    pool = placement_pool(model.pk, start, end, include_offline=include_offline)
    picked: list[int] | None = None
    for split in (False, True):
        if split:
            pool += placement_pool(model.pk, start, end, include_offline=include_offline, split=True)
        sizes: dict[str, int] = {}
        for info, _ in pool:
            sizes[info.node] = sizes.get(info.node, 0) + 1
        free = [info for info, taken in pool if not taken]
        outside = _in_use_outside(model.pk, [info for info, _ in pool], start)
        picked = place(
            [FreeGpu(g.id, g.node, g.index, g.split, g.id in outside) for g in free],
            count,
            sizes,
            allow_multi_node=policy.allow_multi_node,
        )
        if picked is not None:
            break
    if picked is None:
        ids = [g.id for g, _ in pool]
        split_ids = [g.id for g, _ in pool if g.split]
        if split_ids:  # a shared GPU is held through its shares: those are what clash
            shares = Gpu.devices.filter(parent_id__in=split_ids, kind=DeviceKind.SHARE, retired_at__isnull=True)
            ids += list(shares.values_list("id", flat=True))
        found = clashes(ids, start, end)
        raise Conflict(
            f"Not enough {model.name} GPUs are free in that time ({len(free)} free, {count} asked).",
            extra={"conflicts": describe_slots(found, team_id=team.pk, viewer=user), "free": len(free)},
        )
    by_id = {g.id: g for g in free}
    return [by_id[i] for i in picked]
