"""The booking hot path on PostgreSQL in a few raw SQL statements (the ORM path in services.py does the same on
SQLite and is the reference; the tests run both).

Why: a booking through the ORM costs ~20 queries and most of its CPU in query compilation; here the checks are
one query, and the writes (reservation, allocations, quota counters, quota hold, audit entry) are one statement
that inserts nothing when an active allocation clashes. Lock order as in services.py: the team's QuotaUsage rows,
then the GPUs (both in `lock_usage`'s statement), then `insert_booking`, whose snapshot is taken after the GPU
locks, so it sees every booking committed before them; the exclusion constraint stays the last guard.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from apps.booking import quota as quota_math
from apps.core.rawsql import statement_cursor


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
    # The active allocations clashing with the window asked, earliest first, at most CLASHES_PER_GPU (None: not
    # looked up): what a 409 reports, read with the GPU instead of by a second query.
    clashes: tuple[Clash, ...] | None = None


@dataclass(frozen=True)
class Clash:
    """An allocation of a GPU as a conflict report shows it (services.Slot without the GPU's own fields)."""

    team_id: int
    team: str
    start: datetime
    end: datetime
    kind: str
    reservation_id: int | None
    job_id: int | None
    user: str | None


def gpu_info(gpu: Any) -> GpuInfo:
    """GpuInfo of an ORM Gpu (with node and model loaded)."""
    return GpuInfo(
        id=gpu.pk,
        uuid=gpu.uuid,
        index=gpu.index,
        node_id=gpu.node_id,
        node=gpu.node.name,
        node_status=gpu.node.status,
        status=gpu.status,
        model_id=gpu.model_id,
        model=gpu.model.name,
        hourly_price=gpu.model.hourly_price,
    )


# A PL/pgSQL function that keeps one generic plan per connection: PostgreSQL planned this query anew for every
# request (its estimate for a plan without the values was always the higher), which cost more than running it.
# Migration booking 0005 holds its SQL and says more. The casts let PostgreSQL pick the function without guessing.
_GPUS_SQL = (
    "SELECT * FROM portal_booking_gpus(%(uuids)s::text[], %(start)s::timestamptz, %(end)s::timestamptz, %(limit)s::int)"
)


CLASHES_PER_GPU = 50  # = services.MAX_CONFLICTS_SHOWN: a conflict report shows no more


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


def gpus_by_uuid(uuids: Sequence[str], start: datetime, end: datetime) -> dict[str, GpuInfo]:
    """The GPUs named, with the allocations that hold each during [start, end) and whether maintenance blocks it:
    one query (a refused booking needs no second one to say what it clashed with)."""
    with statement_cursor() as cursor:
        cursor.execute(_GPUS_SQL, {"uuids": list(uuids), "start": start, "end": end, "limit": CLASHES_PER_GPU})
        rows = cursor.fetchall()
    out: dict[str, GpuInfo] = {}
    for r in rows:
        raw = r[10]
        if isinstance(raw, str):  # psycopg loads json itself; a plain string if a loader is not registered
            raw = json.loads(raw)
        clashes = tuple(_clash(item) for item in raw or ())
        out[r[1]] = _gpu_row(r, busy=bool(clashes), maintenance=r[11], clashes=clashes)
    return out


def _gpu_row(r: Sequence[Any], **looked_up: Any) -> GpuInfo:
    """GpuInfo from the first ten columns both GPU statements select (id, uuid, index, node id, node name and
    status, GPU status, model id, name and price)."""
    return GpuInfo(
        id=r[0], uuid=r[1], index=r[2], node_id=r[3], node=r[4], node_status=r[5], status=r[6], model_id=r[7],
        model=r[8], hourly_price=r[9], **looked_up,
    )  # fmt: skip


# Every bookable GPU of a model with whether it is taken in [start, end) (an active allocation, found as in the
# GPU lookup, or a maintenance window), for placement: tuples, no ORM objects, one statement. With the pool loaded
# as ORM objects and the busy GPUs asked for by an IN list of all their ids, a booking by model of a 2,048-GPU
# model cost 71 ms in the web process and 56 ms in PostgreSQL, all under the model's placement lock.
_POOL_SQL = """
WITH mw AS MATERIALIZED (
    SELECT w.gpu_id, w.node_id FROM booking_maintenancewindow w WHERE w.start < %(end)s AND w."end" > %(start)s
)
SELECT g.id, g.uuid, g."index", g.node_id, n.name, n.status, g.status, m.id, m.name, m.hourly_price,
       EXISTS (SELECT 1 FROM booking_allocation a
               WHERE a.gpu_id = g.id AND a.active AND a."end" > %(start)s AND a."end" <= %(end)s)
       OR EXISTS (SELECT 1 FROM (SELECT a.start FROM booking_allocation a
                                 WHERE a.gpu_id = g.id AND a.active AND a."end" > %(end)s AND a.start < a."end"
                                 ORDER BY a."end" LIMIT 1) b
                  WHERE b.start < %(end)s)
       OR EXISTS (SELECT 1 FROM mw
                  WHERE mw.gpu_id = g.id OR mw.node_id = g.node_id OR (mw.gpu_id IS NULL AND mw.node_id IS NULL))
FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id JOIN fleet_gpumodel m ON m.id = g.model_id
WHERE g.model_id = %(model)s
  AND CASE WHEN %(include_offline)s THEN g.status <> %(lost)s ELSE g.status = %(ok)s AND n.status = %(online)s END
ORDER BY n.name, g."index"
"""


def placement_pool(
    model_id: int, start: datetime, end: datetime, *, include_offline: bool = False
) -> list[tuple[GpuInfo, bool]]:
    """Each bookable GPU of the model (selectors.bookable_gpus), ordered by node name and index, with whether it is
    taken in [start, end): held by an active allocation or blocked by a maintenance window."""
    from apps.fleet.models import GpuStatus, NodeStatus

    params: dict[str, Any] = {
        "model": model_id,
        "start": start,
        "end": end,
        "include_offline": include_offline,
        "lost": GpuStatus.LOST.value,
        "ok": GpuStatus.OK.value,
        "online": NodeStatus.ONLINE.value,
    }
    with statement_cursor() as cursor:
        cursor.execute(_POOL_SQL, params)
        rows = cursor.fetchall()
    return [(_gpu_row(r), bool(r[10])) for r in rows]


@dataclass(frozen=True)
class UsageRow:
    id: int
    month: date
    used: quota_math.Amount


# The quota rows are locked in (month, slot) order by the first CTE; with GPUs given, the second takes their
# advisory locks (ascending ids) after it: its condition reads all of `u`, so every quota row is locked before
# the first GPU lock (the order services.py keeps everywhere), and only when every month's slot 0 exists (else
# the caller creates the missing rows first, which may wait on another booking: it must hold no GPU then).
_LOCK_USAGE_SQL = """
WITH u AS MATERIALIZED (
    SELECT u.id, u.month, u.gpu_hours, u.cost, u.slot FROM booking_quotausage u
    WHERE u.team_id = %(team)s AND u.month = ANY(%(months)s) ORDER BY u.month, u.slot FOR UPDATE OF u
), g AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(%(ns)s, x)) AS n FROM unnest(%(gpus)s::int[]) AS x
    WHERE (SELECT count(DISTINCT u.month) FROM u WHERE u.slot = 0) = cardinality(%(months)s::date[])
)
SELECT u.id, u.month, u.gpu_hours, u.cost,
       (SELECT coalesce(json_agg(json_build_object(
                   'month', q.month, 'gpu_hours', q.gpu_hours::text, 'max_concurrent_gpus', q.max_concurrent_gpus,
                   'budget_soft', q.budget_soft::text, 'budget_hard', q.budget_hard::text,
                   'models', ARRAY(SELECT am.gpumodel_id FROM booking_quota_allowed_models am
                                   WHERE am.quota_id = q.id))),
                '[]')
        FROM booking_quota q WHERE q.team_id = %(team)s AND (q.month = ANY(%(months)s) OR q.month IS NULL)),
       u.slot, (SELECT n FROM g)
FROM u ORDER BY u.month, u.slot
"""
_CREATE_USAGE_SQL = """
INSERT INTO booking_quotausage (team_id, month, slot, gpu_hours, cost, updated_at)
SELECT %(team)s, m, 0, 0, 0, now() FROM unnest(%(months)s::date[]) AS m
ON CONFLICT (team_id, month, slot) DO NOTHING
"""


def _dec(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)


def _limits_from_json(rows: list[dict[str, Any]], months: Sequence[date]) -> dict[date, quota_math.Limits]:
    by_month: dict[date | None, quota_math.Limits] = {}
    for r in rows:
        month = date.fromisoformat(r["month"]) if r["month"] else None
        by_month[month] = quota_math.Limits(
            gpu_hours=_dec(r["gpu_hours"]),
            max_concurrent_gpus=r["max_concurrent_gpus"],
            budget_soft=_dec(r["budget_soft"]),
            budget_hard=_dec(r["budget_hard"]),
            allowed_model_ids=frozenset(r["models"] or ()),
        )
    default = by_month.get(None, quota_math.Limits())
    return {m: by_month.get(m, default) for m in months}


def lock_usage(
    team_id: int, months: Sequence[date], gpu_ids: Sequence[int] = ()
) -> tuple[dict[date, UsageRow], dict[date, quota_math.Limits]]:
    """Lock the team's QuotaUsage rows (every slot) of `months` (creating slot 0 where missing) in (month, slot)
    order, read the limits that apply to each month and, with `gpu_ids`, take the GPUs' advisory locks after
    them (what services._lock_gpus does), in one statement; needs a transaction. A month's `used` is the sum
    over its slots; `id` is its slot 0, which the booking's write updates."""
    from apps.booking.services import GPU_LOCK_NAMESPACE

    wanted = sorted(set(months))
    gpus = sorted(set(gpu_ids))
    params: dict[str, Any] = {"team": team_id, "months": wanted, "ns": GPU_LOCK_NAMESPACE, "gpus": gpus}
    with statement_cursor() as cursor:
        cursor.execute(_LOCK_USAGE_SQL, params)
        rows = cursor.fetchall()
        if {r[1] for r in rows if r[5] == 0} != set(wanted):
            cursor.execute(_CREATE_USAGE_SQL, params)
            cursor.execute(_LOCK_USAGE_SQL, params)
            rows = cursor.fetchall()
    if not rows or rows[0][6] != len(gpus):  # cannot happen once slot 0 exists; never write without the locks
        raise RuntimeError(f"quota rows or GPU locks not taken for team {team_id}")
    usage: dict[date, UsageRow] = {}
    for r in rows:
        seen = usage.get(r[1])
        used = quota_math.Amount(r[2], r[3])
        if seen is not None:
            used = quota_math.Amount(seen.used.gpu_hours + used.gpu_hours, seen.used.cost + used.cost)
        usage[r[1]] = UsageRow(id=r[0] if r[5] == 0 else seen.id if seen else 0, month=r[1], used=used)
    raw = rows[0][4] if rows else []
    if isinstance(raw, str):
        raw = json.loads(raw)
    return usage, _limits_from_json(raw, wanted)


# The clash check reads as few allocations as the GPU lookup does (migration booking 0005 explains the shape:
# active allocations of one GPU never overlap, so those clashing with [start, end) are the ones ending inside
# (start, end] and at most the first one ending after `end`).
_INSERT_SQL = """
WITH clash AS (
    SELECT 1 FROM unnest(%(gpus)s::bigint[]) AS x(gpu)
    WHERE EXISTS (SELECT 1 FROM booking_allocation a
                  WHERE a.gpu_id = x.gpu AND a.active AND a."end" > %(start)s AND a."end" <= %(end)s)
       OR EXISTS (SELECT 1 FROM (SELECT a.start FROM booking_allocation a
                                 WHERE a.gpu_id = x.gpu AND a.active AND a."end" > %(end)s AND a.start < a."end"
                                 ORDER BY a."end" LIMIT 1) b
                  WHERE b.start < %(end)s)
    LIMIT 1
), r AS (
    INSERT INTO booking_reservation
        (team_id, user_id, gpu_model_id, gpu_count, start, "end", booked_end, status, note, created_at,
         activated_at, ended_at)
    SELECT %(team)s, %(user)s, %(model)s, %(count)s, %(start)s, %(end)s, %(end)s, %(status)s, %(note)s, %(now)s,
           %(activated)s, NULL
    WHERE NOT EXISTS (SELECT 1 FROM clash)
    RETURNING id
), al AS (
    INSERT INTO booking_allocation
        (gpu_id, team_id, user_id, kind, reservation_id, job_id, start, "end", active, created_at, ended_at)
    SELECT g, %(team)s, %(user)s, 'reservation', r.id, NULL, %(start)s, %(end)s, true, %(now)s, NULL
    FROM r, unnest(%(gpus)s::bigint[]) AS g
    RETURNING id
), u AS (
    UPDATE booking_quotausage q SET gpu_hours = q.gpu_hours + d.h, cost = q.cost + d.c, updated_at = %(now)s
    FROM r, unnest(%(usage_ids)s::bigint[], %(hours)s::numeric[], %(costs)s::numeric[]) AS d(id, h, c)
    WHERE q.id = d.id
    RETURNING q.id
), h AS (
    INSERT INTO booking_quotahold
        (team_id, kind, reservation_id, job_id, gpu_count, hourly_rate, start, "end", active, created_at)
    SELECT %(team)s, 'reservation', r.id, NULL, %(count)s, %(rate)s, %(start)s, %(end)s, true, %(now)s FROM r
    RETURNING id
), ev AS (
    INSERT INTO audit_auditevent (created_at, actor_id, action, target_type, target_id, target_repr, team_id, data)
    SELECT %(now)s, %(user)s, 'reservation.create', 'booking.reservation', r.id::text,
           '#' || r.id || %(repr)s, %(team)s, %(data)s::jsonb
    FROM r
    RETURNING id
)
SELECT (SELECT id FROM r), (SELECT count(*) FROM al), (SELECT count(*) FROM u), (SELECT count(*) FROM h),
       (SELECT count(*) FROM ev)
"""


def insert_booking(
    *,
    team_id: int,
    user_id: int | None,
    model_id: int | None,
    gpus: Sequence[int],
    start: datetime,
    end: datetime,
    status: str,
    note: str,
    now: datetime,
    activated_at: datetime | None,
    rate: Decimal,
    usage: dict[date, UsageRow],
    amounts: dict[date, quota_math.Amount],
    audit_data: dict[str, Any],
) -> int | None:
    """Write a booking in one statement: the reservation, one allocation per GPU, the quota counters, the quota
    hold and the audit entry. Returns the reservation id, or None (nothing written) when an active allocation
    clashes. Call with the QuotaUsage rows and the GPUs locked."""
    months = sorted(amounts)
    params = {
        "team": team_id,
        "user": user_id,
        "model": model_id,
        "count": len(gpus),
        "gpus": list(gpus),
        "start": start,
        "end": end,
        "status": status,
        "note": note,
        "now": now,
        "activated": activated_at,
        "rate": rate,
        "usage_ids": [usage[m].id for m in months],
        "hours": [amounts[m].gpu_hours for m in months],
        "costs": [amounts[m].cost for m in months],
        "repr": f" {team_id}: {len(gpus)} GPU {start:%Y-%m-%d %H:%M}-{end:%H:%M}",
        "data": json.dumps(audit_data),
    }
    with statement_cursor() as cursor:
        cursor.execute(_INSERT_SQL, params)
        rid, n_alloc, n_usage, n_hold, n_audit = cursor.fetchone()
    if rid is None:
        return None
    assert (n_alloc, n_usage, n_hold, n_audit) == (len(gpus), len(months), 1, 1)
    return int(rid)
