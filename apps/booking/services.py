"""Writes for booking: GPU allocations, quota holds, reservations and their lifecycle, calendar feeds.

Locks, always taken in this order so two writers cannot deadlock:
0. (placement by model only) the model's placement lock, `pg_advisory_xact_lock(MODEL_LOCK_NAMESPACE, model_id)`;
1. the team's `QuotaUsage` rows of the months involved (`SELECT ... FOR UPDATE`, by month);
2. the GPUs, by `pg_advisory_xact_lock(GPU_LOCK_NAMESPACE, gpu_id)` in ascending id order (PostgreSQL).
On SQLite every `transaction.atomic()` begins IMMEDIATE (settings), so the whole transaction holds the database's
write lock and checks followed by writes are serialized. The exclusion constraint on `booking_allocation`
(PostgreSQL) is the last guard either way.
"""

from __future__ import annotations

import hashlib
import logging
import random
import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from apps.accounts.models import Role, Team
from apps.accounts.scoping import team_ids_of
from apps.audit.services import audit_record
from apps.booking import fastpath, hooks, selectors
from apps.booking import quota as quota_math
from apps.booking.fastpath import GpuInfo, gpu_info
from apps.booking.models import (
    USAGE_SLOTS,
    Allocation,
    AllocationKind,
    BookingPolicy,
    CalendarFeed,
    Quota,
    QuotaHold,
    QuotaUsage,
    Reservation,
    ReservationStatus,
)
from apps.booking.placement import FreeGpu, place
from apps.core import rawsql
from apps.core.errors import Conflict, Forbidden, NotFound, QuotaExceeded, ValidationFailed
from apps.fleet.models import Gpu, GpuModel, GpuStatus, NodeStatus

logger = logging.getLogger(__name__)

GPU_LOCK_NAMESPACE = 0x4750  # "GP": the first key of pg_advisory_xact_lock(int, int) for GPU locks
MODEL_LOCK_NAMESPACE = 0x474D  # "GM": placement by GPU model
MAX_CONFLICTS_SHOWN = fastpath.CLASHES_PER_GPU
PLACEMENT_ATTEMPTS = 3

# --- Allocations: the occupancy table ----------------------------------------------------------------------


def _lock_gpus(gpu_ids: Iterable[int]) -> None:
    """Per-GPU transaction locks in ascending id order (PostgreSQL; SQLite's IMMEDIATE transaction serializes).

    Taking them before the overlap check makes concurrent bookings of one GPU queue up instead of deadlocking
    inside the exclusion check (SQLSTATE 40P01, which PostgreSQL only detects after deadlock_timeout)."""
    if connection.vendor != "postgresql":
        return
    ids = sorted(set(gpu_ids))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, g) FROM unnest(%s::int[]) AS g", [GPU_LOCK_NAMESPACE, ids])


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def describe_slots(slots: Iterable[Slot], *, team_id: int | None, viewer: Any = None) -> list[dict[str, Any]]:
    """Clashing slots as shown to a client: the requesting team's own with details, other teams' with the team
    only (admins see details)."""
    is_admin = bool(getattr(viewer, "is_staff", False))
    out: list[dict[str, Any]] = []
    for a in slots:
        slot: dict[str, Any] = {
            "gpu": a.gpu_uuid,
            "node": a.node,
            "gpu_index": a.gpu_index,
            "start": _iso(a.start),
            "end": _iso(a.end),
            "team": a.team,
        }
        if a.team_id == team_id or is_admin:
            slot.update({"kind": a.kind, "reservation_id": a.reservation_id, "job_id": a.job_id, "user": a.user})
        out.append(slot)
        if len(out) >= MAX_CONFLICTS_SHOWN:
            break
    return out


@dataclass(frozen=True)
class Slot:
    """An allocation as a conflict report needs it."""

    gpu_id: int
    gpu_uuid: str
    gpu_index: int
    node: str
    team_id: int
    team: str
    start: datetime
    end: datetime
    kind: str
    reservation_id: int | None
    job_id: int | None
    user: str | None


_CLASHES_SQL = """
SELECT a.gpu_id, g.uuid, g."index", n.name, a.team_id, t.slug, a.start, a."end", a.kind, a.reservation_id, a.job_id,
       u.username
FROM booking_allocation a
JOIN fleet_gpu g ON g.id = a.gpu_id JOIN fleet_node n ON n.id = g.node_id JOIN accounts_team t ON t.id = a.team_id
LEFT JOIN auth_user u ON u.id = a.user_id
WHERE a.active AND a.gpu_id IN ({ids}) AND a.start < %s AND a."end" > %s
ORDER BY a.gpu_id, a.start
LIMIT {limit}
"""


def _clashes(gpu_ids: Collection[int], start: datetime, end: datetime) -> list[Slot]:
    """Active allocations of these GPUs overlapping [start, end) (one plain query, for conflict reports)."""
    ids = [int(i) for i in gpu_ids]
    if not ids:
        return []
    sql = _CLASHES_SQL.format(ids=", ".join(["%s"] * len(ids)), limit=MAX_CONFLICTS_SHOWN)
    with connection.cursor() as cursor:
        adapt = connection.ops.adapt_datetimefield_value  # SQLite stores naive UTC text
        cursor.execute(sql, [*ids, adapt(end), adapt(start)])
        rows = cursor.fetchall()
    out = []
    for r in rows:
        lo, hi = (v if timezone.is_aware(v) else timezone.make_aware(v, UTC) for v in (r[6], r[7]))
        out.append(Slot(r[0], r[1], r[2], r[3], r[4], r[5], lo, hi, r[8], r[9], r[10], r[11]))
    return out


def _is_exclusion_violation(exc: IntegrityError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "23P01" or "booking_allocation_no_overlap" in str(exc)


def _insert_allocations(
    *,
    gpu_ids: Sequence[int],
    team: Team,
    user: Any,
    start: datetime,
    end: datetime,
    kind: str,
    reservation: Reservation | None,
    job_id: int | None,
    viewer: Any,
) -> list[Allocation]:
    """Lock, check and insert, inside the caller's transaction (no savepoint: a Conflict ends the transaction)."""
    _lock_gpus(gpu_ids)
    clashes = _clashes(gpu_ids, start, end)
    if clashes:
        raise Conflict(
            "Some of these GPUs are already held in that time.",
            extra={"conflicts": describe_slots(clashes, team_id=team.pk, viewer=viewer)},
        )
    user_obj = user if getattr(user, "is_authenticated", False) else None
    rows = [
        Allocation(
            gpu_id=gpu_id,
            team=team,
            user=user_obj,
            kind=kind,
            reservation=reservation,
            job_id=job_id,
            start=start,
            end=end,
        )
        for gpu_id in gpu_ids
    ]
    try:
        return Allocation.objects.bulk_create(rows)
    except IntegrityError as exc:
        if _is_exclusion_violation(exc):
            # Someone inserted without the GPU lock; the constraint held. The transaction is aborted, so the
            # clashing rows cannot be looked up here.
            raise Conflict("Some of these GPUs are already held in that time.", extra={"conflicts": []}) from exc
        raise


def allocations_create(
    *,
    gpus: Sequence[Gpu | int],
    team: Team,
    user: Any,
    start: datetime,
    end: datetime,
    kind: str,
    reservation: Reservation | None = None,
    job_id: int | None = None,
    savepoint: bool = True,
) -> list[Allocation]:
    """Hold each of `gpus` for `team` over [start, end): one active Allocation row per GPU.

    Runs in the caller's transaction (a savepoint inside it, so a caller may catch Conflict and go on) or its own.
    `savepoint=False`: for a caller that has its own savepoint around this call (two round trips less).
    Locks: per-GPU `pg_advisory_xact_lock` in ascending id order, held until the outer transaction ends; callers
    that also hold quota rows must have taken those first (see the module docstring). Raises `Conflict` (409)
    with `conflicts` naming the clashing slots, `ValidationFailed` for a bad window or kind.
    """
    gpu_ids = [g if isinstance(g, int) else g.pk for g in gpus]
    if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
        raise ValidationFailed("Give each GPU once, at least one.")
    if timezone.is_naive(start) or timezone.is_naive(end) or end <= start:
        raise ValidationFailed("An allocation needs aware start < end.")
    if kind not in AllocationKind.values or (kind == AllocationKind.RESERVATION) != (reservation is not None):
        raise ValidationFailed("kind 'reservation' needs a reservation; kind 'job' must not have one.")
    with transaction.atomic(savepoint=savepoint):
        return _insert_allocations(
            gpu_ids=gpu_ids,
            team=team,
            user=user,
            start=start,
            end=end,
            kind=kind,
            reservation=reservation,
            job_id=job_id,
            viewer=user,
        )


@dataclass(frozen=True)
class AllocationRequest:
    gpu_ids: Sequence[int]
    team: Team
    user: Any
    start: datetime
    end: datetime
    kind: str
    job_id: int | None = None


def _held_allocations(gpu_ids: Sequence[int], *, after: datetime) -> list[tuple[int, datetime, datetime]]:
    """(gpu, start, end) of the active allocations of `gpu_ids` that end after `after`. Hand-written: the
    scheduler asks on every pass that starts jobs, and compiling the ORM query cost more than running it."""
    where, params = rawsql.in_clause("gpu_id", gpu_ids)
    table = Allocation._meta.db_table
    sql = f'SELECT gpu_id, start, "end" FROM {table} WHERE active = %s AND {where} AND "end" > %s'  # noqa: S608
    rows = rawsql.fetch_all(sql, [True, *params, rawsql.datetime_param(after)])
    start_of = rawsql.field_converter(Allocation, "start") or (lambda v: v)
    end_of = rawsql.field_converter(Allocation, "end") or (lambda v: v)
    return [(int(g), start_of(a), end_of(b)) for g, a, b in rows]


def allocations_create_many(requests: Sequence[AllocationRequest], *, savepoint: bool = True) -> list[Allocation]:
    """`allocations_create` for many holders at once (the scheduler starting a pass's jobs): one lock statement,
    one overlap query, one insert. All or nothing: Conflict (without the slots: the caller retries one by one to
    learn them) when any request overlaps an active allocation or another request. Reservations are not taken
    here (they come one at a time, with their own checks). `savepoint` as for `allocations_create`."""
    if not requests:
        return []
    wanted: list[tuple[int, datetime, datetime]] = []
    for req in requests:
        if not req.gpu_ids or len(set(req.gpu_ids)) != len(req.gpu_ids):
            raise ValidationFailed("Give each GPU once, at least one.")
        if timezone.is_naive(req.start) or timezone.is_naive(req.end) or req.end <= req.start:
            raise ValidationFailed("An allocation needs aware start < end.")
        if req.kind == AllocationKind.RESERVATION or req.kind not in AllocationKind.values:
            raise ValidationFailed("allocations_create_many takes job allocations only.")
        wanted.extend((int(g), req.start, req.end) for g in req.gpu_ids)
    clash = Conflict("Some of these GPUs are already held in that time.", extra={"conflicts": []})
    by_gpu: dict[int, list[tuple[datetime, datetime]]] = {}
    for gpu_id, lo, hi in wanted:
        if any(lo < b and a < hi for a, b in by_gpu.get(gpu_id, ())):
            raise clash
        by_gpu.setdefault(gpu_id, []).append((lo, hi))
    with transaction.atomic(savepoint=savepoint):
        _lock_gpus(by_gpu)
        earliest = min(lo for _, lo, _ in wanted)
        for gpu_id, a, b in _held_allocations(sorted(by_gpu), after=earliest):
            if any(lo < b and a < hi for lo, hi in by_gpu[gpu_id]):
                raise clash
        rows = [
            Allocation(
                gpu_id=int(gpu_id),
                team=req.team,
                user=req.user if getattr(req.user, "is_authenticated", False) else None,
                kind=req.kind,
                job_id=req.job_id,
                start=req.start,
                end=req.end,
            )
            for req in requests
            for gpu_id in req.gpu_ids
        ]
        try:
            rawsql.insert(rows)
        except IntegrityError as exc:
            if _is_exclusion_violation(exc):
                raise clash from exc
            raise
        return rows


def allocations_end_of_job(*, job_id: int, at: datetime) -> int:
    """`allocation_end` for every active allocation of a job, in one conditional UPDATE and no lookup first (every
    job's end passes here; hand-written, as compiling the ORM's two UPDATEs cost more CPU than running them): rows
    not started by `at` are deactivated, running ones end at `at`, rows already over stay. Returns how many rows
    changed."""
    table, q = Allocation._meta.db_table, connection.ops.quote_name
    # Table and column names from the model's metadata; every value is a parameter.
    sql = (
        f"UPDATE {table} SET {q('active')} = CASE WHEN {q('start')} >= %s THEN %s ELSE {q('active')} END, "  # noqa: S608
        f"{q('end')} = CASE WHEN {q('start')} < %s THEN %s ELSE {q('end')} END, {q('ended_at')} = %s "
        f"WHERE {q('kind')} = %s AND {q('job_id')} = %s AND {q('active')} = %s "
        f"AND ({q('start')} >= %s OR {q('end')} > %s)"
    )
    t = connection.ops.adapt_datetimefield_value(at)  # SQLite stores naive UTC text: compare like with like
    with connection.cursor() as cursor:
        cursor.execute(sql, [t, False, t, t, t, AllocationKind.JOB, job_id, True, t, t])
        return cursor.rowcount


def allocation_end(*, allocation_ids: Iterable[int], at: datetime) -> int:
    """End allocations at `at`: rows that have not started by then are deactivated (they leave the exclusion
    constraint), running rows get `end = at`; rows already over are left alone. Conditional UPDATEs, so it is
    idempotent and safe against a concurrent end. Returns how many rows changed. The GPUs are free from `at` on.
    """
    ids = list(allocation_ids)
    if not ids:
        return 0
    with transaction.atomic():
        base = Allocation.objects.filter(pk__in=ids, active=True)
        cancelled = base.filter(start__gte=at).update(active=False, ended_at=at)
        cut = base.filter(start__lt=at, end__gt=at).update(end=at, ended_at=at)
    return cancelled + cut


# --- Quotas -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaCheck:
    """The hold a booking or job placed on its team's quota, and soft-limit warnings to show."""

    hold: QuotaHold
    warnings: list[dict[str, Any]] = field(default_factory=list)


def _lock_usage(team_id: int, months: Sequence[date]) -> dict[date, QuotaUsage]:
    """Lock every usage row (slot) of the team for `months`, in (month, slot) order, creating slot 0 where missing.

    Returns each month's slot-0 row with `gpu_hours`/`cost` set, in memory only, to the month's total over its
    slots: what a check compares against. Writes go through `_apply_usage` (an UPDATE of slot 0 by id)."""
    months = sorted(set(months))

    def select() -> list[QuotaUsage]:
        return list(
            QuotaUsage.objects.select_for_update().filter(team_id=team_id, month__in=months).order_by("month", "slot")
        )

    rows = select()
    if {u.month for u in rows if u.slot == 0} != set(months):
        QuotaUsage.objects.bulk_create(
            [QuotaUsage(team_id=team_id, month=m, slot=0) for m in months], ignore_conflicts=True
        )
        rows = select()
    out: dict[date, QuotaUsage] = {}
    totals: dict[date, quota_math.Amount] = {}
    for u in rows:
        if u.slot == 0:
            out[u.month] = u
        total = totals.get(u.month, quota_math.Amount())
        totals[u.month] = quota_math.Amount(total.gpu_hours + u.gpu_hours, total.cost + u.cost)
    for month, u in out.items():
        u.gpu_hours, u.cost = totals[month].gpu_hours, totals[month].cost
    return out


def _apply_usage(team_id: int, deltas: dict[date, quota_math.Amount], usage: dict[date, QuotaUsage]) -> None:
    for month, delta in deltas.items():
        QuotaUsage.objects.filter(pk=usage[month].pk).update(
            gpu_hours=F("gpu_hours") + delta.gpu_hours, cost=F("cost") + delta.cost, updated_at=timezone.now()
        )


# PostgreSQL: add to the first usage row of the month that no one holds (a job end of the same team may be
# committing on another); when all are held, to a new slot.
_ADD_USAGE_FREE_SLOT_SQL = """
UPDATE booking_quotausage SET gpu_hours = gpu_hours + %(h)s, cost = cost + %(c)s, updated_at = %(now)s
WHERE id = (SELECT id FROM booking_quotausage WHERE team_id = %(team)s AND month = %(month)s
            ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
"""
_USAGE_SLOTS_SQL = "SELECT array_agg(slot) FROM booking_quotausage WHERE team_id = %(team)s AND month = %(month)s"
_ADD_USAGE_ANY_SLOT_SQL = """
INSERT INTO booking_quotausage (team_id, month, slot, gpu_hours, cost, updated_at)
VALUES (%(team)s, %(month)s, %(slot)s, %(h)s, %(c)s, %(now)s)
ON CONFLICT (team_id, month, slot) DO UPDATE SET gpu_hours = booking_quotausage.gpu_hours + EXCLUDED.gpu_hours,
    cost = booking_quotausage.cost + EXCLUDED.cost, updated_at = EXCLUDED.updated_at
"""


def _add_usage(team_id: int, deltas: dict[date, quota_math.Amount]) -> None:
    """Add `deltas` to the team's usage without a check (a team without amount limits, a refund): no
    SELECT ... FOR UPDATE, and on PostgreSQL into whichever slot of the month is free, so concurrent submissions and
    job ends of one team do not queue on one row until each other's commit. A check (`_lock_usage`) locks every
    slot, so it waits for these writes and counts them. On SQLite writes are serialized anyway: slot 0."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for month in sorted(deltas):
                params: dict[str, Any] = {"team": team_id, "month": month, "now": now, "h": deltas[month].gpu_hours}
                params["c"] = deltas[month].cost
                cursor.execute(_ADD_USAGE_FREE_SLOT_SQL, params)
                if cursor.rowcount == 0:
                    # No row yet, or every row held: a new slot (slot 0 first). Not an INSERT that conflicts with
                    # a held row: that waits for the holder's commit, the very queue this avoids. With every slot
                    # taken and held, one at random (then it waits for that one).
                    cursor.execute(_USAGE_SLOTS_SQL, params)
                    taken = set(cursor.fetchone()[0] or ())
                    free = [n for n in range(USAGE_SLOTS) if n not in taken]
                    params["slot"] = free[0] if free else random.randrange(USAGE_SLOTS)
                    cursor.execute(_ADD_USAGE_ANY_SLOT_SQL, params)
        return
    for month in sorted(deltas):
        delta = deltas[month]
        changes = {"gpu_hours": F("gpu_hours") + delta.gpu_hours, "cost": F("cost") + delta.cost, "updated_at": now}
        if not QuotaUsage.objects.filter(team_id=team_id, month=month, slot=0).update(**changes):
            QuotaUsage.objects.bulk_create([QuotaUsage(team_id=team_id, month=month)], ignore_conflicts=True)
            QuotaUsage.objects.filter(team_id=team_id, month=month, slot=0).update(**changes)


def _limited(limits: quota_math.Limits) -> bool:
    """Whether any amount limit applies (allowed models are checked without the usage rows)."""
    return any(
        v is not None for v in (limits.gpu_hours, limits.max_concurrent_gpus, limits.budget_soft, limits.budget_hard)
    )


def _month_label(month: date) -> str:
    return month.strftime("%Y-%m")


def _fmt(value: Decimal | int | None) -> str | int | None:
    if value is None or isinstance(value, int):
        return value
    return str(quota_math.q4(value))


def quota_models_check(
    *, team: Team, months: Sequence[date], gpu_model_ids: Collection[int], quotas: Any = None
) -> None:
    """Refuse (403 `model_not_allowed`) a model the team's quota for any of `months` does not allow."""
    quotas = quotas if quotas is not None else selectors.quotas_for(team_id=team.pk, months=months)
    for month in months:
        limits = selectors.limits_of(quotas[month])
        refused = [mid for mid in gpu_model_ids if not limits.allows_model(mid)]
        if refused:
            names = sorted(GpuModel.objects.filter(pk__in=refused).values_list("name", flat=True))
            allowed = sorted(
                GpuModel.objects.filter(pk__in=limits.allowed_model_ids or []).values_list("name", flat=True)
            )
            raise Forbidden(
                f"Team {team.slug} may not use {', '.join(names)} in {_month_label(month)}.",
                code="model_not_allowed",
                extra={"allowed_models": allowed},
            )


def _quota_check_and_hold(
    *,
    team: Team,
    gpu_count: int,
    start: datetime,
    end: datetime,
    hourly_rate: Decimal,
    kind: str,
    gpu_model_ids: Collection[int] = (),
    reservation: Reservation | None = None,
    job_id: int | None = None,
    check_concurrency: bool = True,
    quotas: Any = None,
) -> QuotaCheck:
    """`quota_check_and_hold` inside the caller's transaction, without a savepoint."""
    tz = selectors.local_tz()
    amounts = quota_math.hold_amounts(start=start, end=end, gpu_count=gpu_count, hourly_rate=hourly_rate, tz=tz)
    months = sorted(amounts)
    # No savepoint of its own: a refusal ends the caller's transaction (the public function adds one).
    with transaction.atomic(savepoint=False):
        # The limits are configuration (the usage lock does not guard them): read before taking it, or taken
        # from the caller, who read them for these months already (a job's submission).
        if quotas is None or any(m not in quotas for m in months):
            quotas = selectors.quotas_for(team_id=team.pk, months=months)
        if gpu_model_ids:
            quota_models_check(team=team, months=months, gpu_model_ids=gpu_model_ids, quotas=quotas)
        limits = {m: selectors.limits_of(quotas[m]) for m in months}
        # The hold before the usage rows, so the usage lock is held for as little as possible: from the check to
        # the caller's commit (at 30 jobs/s of one team, waits for it were most of a submission's database time).
        hold = QuotaHold(
            team=team,
            kind=kind,
            reservation=reservation,
            job_id=job_id,
            gpu_count=gpu_count,
            hourly_rate=hourly_rate,
            start=start,
            end=end,
        )
        rawsql.insert([hold])
        if not any(_limited(limit) for limit in limits.values()):
            # Nothing to check against: count it (the UPDATE takes the row lock, only until the commit).
            _add_usage(team.pk, amounts)
            return QuotaCheck(hold=hold, warnings=[])
        usage = _lock_usage(team.pk, months)
        warnings = _quota_verdicts(
            team=team,
            limits=limits,
            used={m: quota_math.Amount(usage[m].gpu_hours, usage[m].cost) for m in months},
            amounts=amounts,
            start=start,
            end=end,
            gpu_count=gpu_count,
            check_concurrency=check_concurrency,
        )
        _apply_usage(team.pk, amounts, usage)
    return QuotaCheck(hold=hold, warnings=warnings)


def quota_check_and_hold(
    *,
    team: Team,
    gpu_count: int,
    start: datetime,
    end: datetime,
    hourly_rate: Decimal,
    kind: str,
    gpu_model_ids: Collection[int] = (),
    reservation: Reservation | None = None,
    job_id: int | None = None,
    check_concurrency: bool = True,
    quotas: Mapping[date, Quota | None] | None = None,
    savepoint: bool = True,
) -> QuotaCheck:
    """Count `gpu_count` GPUs over [start, end) at `hourly_rate` (the price of all of them per hour) against
    `team`'s quota of every month they touch, or refuse.

    Locks the team's QuotaUsage rows of those months (`SELECT ... FOR UPDATE`) until the caller's transaction
    ends, so concurrent checks of one team queue up and together cannot exceed the quota; run it inside the
    transaction that writes the booking or job (there it runs in a savepoint, so a refusal can be caught).
    `check_concurrency`: also refuse when the team would hold more than `max_concurrent_gpus` at some instant
    (counting active allocations; a queued job has none yet, so jobs pass False at submit and call
    `quota_concurrency_check` when they are placed). Raises `QuotaExceeded` (403, with `remaining`, `month`,
    `exceeded`) or `Forbidden` (`model_not_allowed`). Returns the hold and soft-limit warnings.
    `savepoint=False`: for a caller whose whole transaction ends with a refusal anyway (two round trips less).
    """
    # A savepoint when nested (unless the caller says otherwise): a caller may catch the refusal and go on.
    with transaction.atomic(savepoint=savepoint):
        return _quota_check_and_hold(
            team=team,
            gpu_count=gpu_count,
            start=start,
            end=end,
            hourly_rate=hourly_rate,
            kind=kind,
            gpu_model_ids=gpu_model_ids,
            reservation=reservation,
            job_id=job_id,
            check_concurrency=check_concurrency,
            quotas=quotas,
        )


def quota_concurrency_check(*, team: Team, start: datetime, end: datetime, gpu_count: int) -> None:
    """Refuse (QuotaExceeded) when `team` holding `gpu_count` more GPUs over [start, end) would exceed its
    `max_concurrent_gpus` in some month. Takes the same QuotaUsage row locks as `quota_check_and_hold`; call it in
    the transaction that then calls `allocations_create`."""
    tz = selectors.local_tz()
    months = [m for m, _ in quota_math.split_by_month(start, end, tz)]
    with transaction.atomic():
        _lock_usage(team.pk, months)
        quotas = selectors.quotas_for(team_id=team.pk, months=months)
        for month in months:
            limits = selectors.limits_of(quotas[month])
            if limits.max_concurrent_gpus is None:
                continue
            first, after = quota_math.month_bounds(month, tz)
            lo, hi = max(start, first), min(end, after)
            peak = selectors.team_peak_gpus(team_id=team.pk, start=lo, end=hi)
            if peak + gpu_count > limits.max_concurrent_gpus:
                raise QuotaExceeded(
                    f"Team {team.slug} may hold at most {limits.max_concurrent_gpus} GPUs at once.",
                    extra={
                        "month": _month_label(month),
                        "exceeded": ["concurrent_gpus"],
                        "remaining": {"concurrent_gpus": limits.max_concurrent_gpus - peak},
                    },
                )


def _find_hold(*, reservation: Reservation | None, job_id: int | None) -> QuotaHold | None:
    """The hold, locked. Hand-written SQL: every job's end passes here (the compiled ORM query cost more CPU)."""
    if reservation is not None:
        column, value = "reservation_id", reservation.pk
    elif job_id is not None:
        column, value = "job_id", job_id
    else:
        raise ValidationFailed("Name the reservation or the job whose quota hold changes.")

    cols = rawsql.columns(QuotaHold, "h")
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""  # SQLite: the write lock serializes
    # Table and column names from the model's metadata; the id is a parameter.
    sql = f"SELECT {cols.sql} FROM {QuotaHold._meta.db_table} h WHERE h.{column} = %s ORDER BY h.id LIMIT 1{lock}"  # noqa: S608
    row = rawsql.fetch_one(sql, [value])
    return cols.load(row) if row is not None else None


def quota_hold_update(
    *,
    reservation: Reservation | None = None,
    job_id: int | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    release: bool = False,
) -> QuotaHold | None:
    """Move, cut or (release=True) drop the quota hold of a reservation or job, giving back (or, when it grows,
    counting without a check) the difference in each month. A job that finishes calls it with its real
    [start, end); a cancelled reservation or job with release=True. Locks the hold row, then the QuotaUsage rows.
    Idempotent; returns the hold (None if there is none)."""
    tz = selectors.local_tz()
    with transaction.atomic(savepoint=False):
        hold = _find_hold(reservation=reservation, job_id=job_id)
        if hold is None or not hold.active:
            return hold
        before = quota_math.hold_amounts(
            start=hold.start, end=hold.end, gpu_count=hold.gpu_count, hourly_rate=hold.hourly_rate, tz=tz
        )
        new_start, new_end = start or hold.start, end or hold.end
        if release or new_end <= new_start:
            after: dict[date, quota_math.Amount] = {}
            hold.active = False
        else:
            after = quota_math.hold_amounts(
                start=new_start, end=new_end, gpu_count=hold.gpu_count, hourly_rate=hold.hourly_rate, tz=tz
            )
            hold.start, hold.end = new_start, new_end
        deltas = quota_math.amounts_delta(before, after)
        rawsql.update(QuotaHold, {"id": hold.pk}, {"start": hold.start, "end": hold.end, "active": hold.active})
        if deltas:
            # Last, and without SELECT ... FOR UPDATE (nothing is checked): the team's usage rows stay locked only
            # from here to the caller's commit. Every job exit of the team passes here.
            _add_usage(hold.team_id, deltas)
    return hold


def quota_hold_release(*, reservation: Reservation | None = None, job_id: int | None = None) -> QuotaHold | None:
    """Give back everything a reservation's or job's hold counted (cancelled before it used anything)."""
    return quota_hold_update(reservation=reservation, job_id=job_id, release=True)


# --- Reservations -----------------------------------------------------------------------------------------

_TRANSITIONS: dict[str, set[str]] = {
    ReservationStatus.BOOKED: {ReservationStatus.ACTIVE, ReservationStatus.CANCELLED, ReservationStatus.RELEASED},
    ReservationStatus.ACTIVE: {ReservationStatus.RELEASED},
    ReservationStatus.RELEASED: set(),
    ReservationStatus.CANCELLED: set(),
}


def _transition(reservation_id: int, to: str, **changes: Any) -> bool:
    """Move a reservation to status `to` with a conditional UPDATE from the statuses that may move there.
    False when it was not in one of them (already moved by someone else, or an illegal move)."""
    sources = [s for s, targets in _TRANSITIONS.items() if to in targets]
    return bool(Reservation.objects.filter(pk=reservation_id, status__in=sources).update(status=to, **changes))


@dataclass(frozen=True)
class BookingResult:
    """A new reservation, the GPUs it holds and the soft-limit warnings to show with it."""

    reservation: Reservation
    warnings: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)


def _aligned(moment: datetime, minutes: int) -> bool:
    local = moment.astimezone(selectors.local_tz())
    return local.second == 0 and local.microsecond == 0 and (local.hour * 60 + local.minute) % minutes == 0


def _floor(moment: datetime, minutes: int) -> datetime:
    local = moment.astimezone(selectors.local_tz())
    past = (local.hour * 60 + local.minute) % minutes
    return (local - timedelta(minutes=past, seconds=local.second, microseconds=local.microsecond)).astimezone(UTC)


def check_window(*, start: datetime, end: datetime, policy: BookingPolicy, now: datetime) -> None:
    """Refuse (400) a window the policy does not allow: not aware, empty, in the past, misaligned, too short,
    too long, too far ahead."""
    fields: dict[str, list[str]] = {}
    if timezone.is_naive(start) or timezone.is_naive(end):
        raise ValidationFailed("Times need a UTC offset.", fields={"start": ["Give an offset, e.g. +00:00."]})
    if end <= start:
        raise ValidationFailed("end must be after start.", fields={"end": ["Must be after start."]})
    g = max(1, policy.granularity_minutes)
    if start < _floor(now, g):
        fields["start"] = ["Must not be in the past."]
    for name, value in (("start", start), ("end", end)):
        if not _aligned(value, g):
            fields.setdefault(name, []).append(f"Must align to {g} minutes.")
    duration = end.astimezone(UTC) - start.astimezone(UTC)  # real time, not wall-clock time, across DST
    if duration < timedelta(minutes=policy.min_duration_minutes):
        fields.setdefault("end", []).append(f"A booking lasts at least {policy.min_duration_minutes} minutes.")
    if duration > timedelta(hours=policy.max_duration_hours):
        fields.setdefault("end", []).append(f"A booking lasts at most {policy.max_duration_hours} hours.")
    if start > now + timedelta(days=policy.max_advance_days):
        fields.setdefault("start", []).append(f"Book at most {policy.max_advance_days} days ahead.")
    if fields:
        detail = "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
        raise ValidationFailed(f"This time window is not allowed ({detail}).", fields=fields)


def _check_member(user: Any, team: Team) -> None:
    if getattr(user, "is_staff", False):
        return
    # `is_member`: annotated by selectors.team_for_booking, which saves the membership query.
    member = getattr(team, "is_member", None)
    if member is None:
        member = team.pk in team_ids_of(user)
    if not member:
        raise Forbidden(f"You are not a member of team {team.slug}.", code="not_a_member")


def _resolve_model(gpu_model: str | GpuModel | None) -> GpuModel:
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


def _resolve_gpus(
    gpus: Sequence[str | Gpu], start: datetime, end: datetime, *, include_offline: bool = False
) -> list[GpuInfo]:
    """The GPUs named, in order; 404 for unknown ones, 400 for ones that cannot be booked. On PostgreSQL one
    query that also says whether each is held or under maintenance in [start, end)."""
    wanted = [g.uuid if isinstance(g, Gpu) else str(g) for g in gpus]
    if len(set(wanted)) != len(wanted):
        raise ValidationFailed("A GPU is named twice.", fields={"gpus": ["Name each GPU once."]})
    if connection.vendor == "postgresql":
        rows = fastpath.gpus_by_uuid(wanted, start, end)
    else:
        rows = {g.uuid: gpu_info(g) for g in Gpu.objects.filter(uuid__in=wanted).select_related("node", "model")}
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


def _slot(gpu: GpuInfo, c: fastpath.Clash) -> Slot:
    return Slot(gpu.id, gpu.uuid, gpu.index, gpu.node, c.team_id, c.team, c.start, c.end, c.kind, c.reservation_id,
                c.job_id, c.user)  # fmt: skip


def _precheck(gpus: Sequence[GpuInfo], start: datetime, end: datetime, *, team: Team, user: Any) -> None:
    """409 before any lock when a named GPU is under maintenance or already held (the locked check repeats it)."""
    if gpus and gpus[0].maintenance is not None:
        blocked = {g.id for g in gpus if g.maintenance}
        busy = any(g.busy for g in gpus)
    else:
        blocked = selectors.maintenance_blocked_gpu_ids(start=start, end=end, gpu_ids=[g.id for g in gpus])
        busy = True  # not known: look
    if blocked:
        raise Conflict(
            "A maintenance window blocks some of these GPUs in that time.",
            extra={
                "conflicts": [{"gpu": g.uuid, "node": g.node, "maintenance": True} for g in gpus if g.id in blocked]
            },
        )
    if busy:
        if all(g.clashes is not None for g in gpus):  # read with the GPUs (PostgreSQL): ordered as _clashes orders
            found = [_slot(g, c) for g in gpus for c in g.clashes or ()]
            clashes = sorted(found, key=lambda slot: (slot.gpu_id, slot.start))[:MAX_CONFLICTS_SHOWN]
        else:
            clashes = _clashes([g.id for g in gpus], start, end)
        if clashes:
            raise Conflict(
                "Some of these GPUs are already held in that time.",
                extra={"conflicts": describe_slots(clashes, team_id=team.pk, viewer=user)},
            )


def _send_holds(reservation_id: int, *, until: datetime | None = None) -> None:
    """Tell each node agent which of its GPUs the reservation holds, for which team, until when. Call inside the
    transaction that made the change: `agent_send` signs each command now and sends it after commit."""
    from apps.fleet.commands import agent_send

    rows = list(
        Allocation.objects.filter(reservation_id=reservation_id)
        .select_related("gpu__node", "team")
        .order_by("gpu__node__name", "gpu__index")
    )
    by_node: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    for a in rows:
        node, holds = by_node.setdefault(a.gpu.node.name, (a.gpu.node, []))
        holds.append(
            {
                "gpu_uuid": a.gpu.uuid,
                "team": a.team.slug,
                "reservation_id": reservation_id,
                "until": _iso(until or a.end),
            }
        )
    for node, holds in by_node.values():
        try:
            agent_send(node=node, task="agent.hold_gpus", body={"holds": holds})
        except Conflict:
            # No node token yet, so no agent could verify it; the booking stands, the agent learns on resend.
            logger.warning("node %s has no token; not told about reservation %s", node.name, reservation_id)


def _emit_ended(reservation_id: int, *, early: bool) -> None:
    r = Reservation.objects.filter(pk=reservation_id).values("team_id", "end").first()
    if r is None:
        return
    gpu_ids = tuple(Allocation.objects.filter(reservation_id=reservation_id).values_list("gpu_id", flat=True))
    grace = selectors.booking_policy().end_grace_minutes * 60
    hooks.on_reservation_ended(
        hooks.ReservationEnded(
            reservation_id=reservation_id,
            team_id=r["team_id"],
            gpu_ids=gpu_ids,
            ended_at=r["end"],
            early=early,
            grace_s=grace,
        )
    )


def _lock_model(model_id: int) -> None:
    """Serialize placement per GPU model (PostgreSQL): concurrent bookings by model would otherwise all pick the
    same best-fit GPUs and all but one lose them. Taken before the quota rows and the GPU locks."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MODEL_LOCK_NAMESPACE, model_id])


def _place_locked(
    *,
    model: GpuModel,
    count: int,
    start: datetime,
    end: datetime,
    policy: BookingPolicy,
    team: Team,
    user: Any,
    include_offline: bool = False,
) -> list[GpuInfo]:
    """Pick `count` free GPUs of `model` for [start, end) under the model's placement lock (inside the
    caller's transaction); 409 when there are not enough."""
    _lock_model(model.pk)
    pool: list[tuple[GpuInfo, bool]]
    if connection.vendor == "postgresql":  # one statement, tuples (fastpath.placement_pool says why)
        pool = fastpath.placement_pool(model.pk, start, end, include_offline=include_offline)
    else:
        gpus = list(
            selectors.bookable_gpus(model=model, include_offline=include_offline)
            .select_related("node", "model")
            .order_by("node__name", "index")
        )
        taken = selectors.busy_gpu_ids(start=start, end=end, gpu_ids=[g.pk for g in gpus])
        taken |= selectors.maintenance_blocked_gpu_ids(start=start, end=end, gpu_ids=[g.pk for g in gpus])
        pool = [(gpu_info(g), g.pk in taken) for g in gpus]
    sizes: dict[str, int] = {}
    for info, _ in pool:
        sizes[info.node] = sizes.get(info.node, 0) + 1
    free = [info for info, taken_ in pool if not taken_]
    picked = place(
        [FreeGpu(g.id, g.node, g.index) for g in free], count, sizes, allow_multi_node=policy.allow_multi_node
    )
    if picked is None:
        clashes = _clashes([g.id for g, _ in pool], start, end)
        raise Conflict(
            f"Not enough {model.name} GPUs are free in that time ({len(free)} free, {count} asked).",
            extra={
                "conflicts": describe_slots(clashes, team_id=team.pk, viewer=user),
                "free": len(free),
            },
        )
    by_id = {g.id: g for g in free}
    return [by_id[i] for i in picked]


def reservation_create(
    *,
    user: Any,
    team: Team,
    start: datetime,
    end: datetime,
    gpu_count: int | None = None,
    gpu_model: str | GpuModel | None = None,
    gpus: Sequence[str | Gpu] | None = None,
    note: str = "",
    include_offline: bool = False,
) -> BookingResult:
    """Book `gpu_count` GPUs of `gpu_model` (placed: one node where possible, best fit) or exactly `gpus`
    (uuids) for `team` over [start, end).

    Checks, before anything is written: membership (403), the policy's window rules (400), the GPUs or model
    (404 unknown GPU, 400 offline/unknown model/count), the quota's allowed models (403), maintenance and
    clashes (409). Then in one transaction: the reservation, the quota hold (QuotaUsage row locks; 403
    `quota_exceeded`), the allocations (GPU locks + check + exclusion constraint; 409 `conflict`), the audit entry.
    A placed booking that loses its GPUs to a concurrent one is placed again (a few times) before 409.
    A booking starting now is active at once and its node agents are told after commit.
    `include_offline` (not exposed over the API): also book GPUs that are merely offline, e.g. demo data loaded
    before the node agent connects.
    """
    now = timezone.now()
    policy = selectors.booking_policy()
    _check_member(user, team)
    check_window(start=start, end=end, policy=policy, now=now)
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    # A booking of the current slot holds from now: the past part of the slot may still be held by a reservation
    # released a moment ago (its end was cut to the release time), and nobody can use the past anyway.
    start = max(start, now)
    note = (note or "").strip()
    if len(note) > 500:
        raise ValidationFailed("The note is too long.", fields={"note": ["At most 500 characters."]})

    explicit: list[GpuInfo] | None = None
    model: GpuModel | None = None
    if gpus:
        explicit = _resolve_gpus(gpus, start, end, include_offline=include_offline)
        if gpu_count is not None and gpu_count != len(explicit):
            raise ValidationFailed(
                "gpu_count does not match the GPUs named.", fields={"gpu_count": ["Equals the number of GPUs."]}
            )
        if gpu_model is not None:
            model = _resolve_model(gpu_model)
            if any(g.model_id != model.pk for g in explicit):
                raise ValidationFailed("The GPUs named are not all of that model.", fields={"gpus": ["Wrong model."]})
        count = len(explicit)
        model_ids = {g.model_id for g in explicit}
        model_id = explicit[0].model_id if len(model_ids) == 1 else None
    else:
        model = _resolve_model(gpu_model)
        if gpu_count is None or gpu_count <= 0:
            raise ValidationFailed("Book at least one GPU.", fields={"gpu_count": ["At least 1."]})
        count = gpu_count
        # GPUs per node, counted by the database (a row per node, not per GPU).
        per_node = dict(
            selectors.bookable_gpus(model=model, include_offline=include_offline)
            .order_by()
            .values("node_id")
            .annotate(n=Count("id"))
            .values_list("node_id", "n")
        )
        most = max(per_node.values(), default=0) if not policy.allow_multi_node else sum(per_node.values())
        if count > most:
            where = "node" if not policy.allow_multi_node else "fleet"
            raise ValidationFailed(
                f"No {where} has {count} bookable {model.name} GPUs (at most {most}).",
                fields={"gpu_count": [f"At most {most}."]},
            )
        model_id = model.pk
        model_ids = {model.pk}

    tz = selectors.local_tz()
    months = [m for m, _ in quota_math.split_by_month(start, end, tz)]
    pg = connection.vendor == "postgresql"
    quotas = None
    if not pg:  # PostgreSQL reads the limits with the quota row lock (fastpath.lock_usage)
        quotas = selectors.quotas_for(team_id=team.pk, months=months)
        _models_allowed(team=team, limits={m: selectors.limits_of(quotas[m]) for m in months}, model_ids=model_ids)
    if explicit is not None:
        _precheck(explicit, start, end, team=team, user=user)

    status = ReservationStatus.ACTIVE if start <= now else ReservationStatus.BOOKED
    activated_at = now if status == ReservationStatus.ACTIVE else None
    user_obj = user if getattr(user, "is_authenticated", False) else None
    for attempt in range(PLACEMENT_ATTEMPTS):
        try:
            with transaction.atomic():
                if explicit is not None:
                    chosen = explicit
                else:
                    assert model is not None
                    chosen = _place_locked(
                        model=model,
                        count=count,
                        start=start,
                        end=end,
                        policy=policy,
                        team=team,
                        user=user,
                        include_offline=include_offline,
                    )
                rate = sum((g.hourly_price for g in chosen), Decimal("0"))
                audit_data = {
                    "gpus": [g.uuid for g in chosen],
                    "start": _iso(start),
                    "end": _iso(end),
                    "status": status,
                }
                if pg:
                    reservation, warnings = _book_pg(
                        team=team, user=user_obj, model_id=model_id, model_ids=model_ids, chosen=chosen, start=start,
                        end=end, status=status, note=note, now=now, activated_at=activated_at, rate=rate,
                        audit_data=audit_data,
                    )  # fmt: skip
                else:
                    reservation = Reservation.objects.create(
                        team=team,
                        user=user_obj,
                        gpu_model_id=model_id,
                        gpu_count=count,
                        start=start,
                        end=end,
                        booked_end=end,
                        status=status,
                        note=note,
                        activated_at=activated_at,
                    )
                    check = _quota_check_and_hold(
                        team=team,
                        gpu_count=count,
                        start=start,
                        end=end,
                        hourly_rate=rate,
                        kind=AllocationKind.RESERVATION,
                        reservation=reservation,
                        quotas=quotas,
                    )
                    warnings = check.warnings
                    _insert_allocations(
                        gpu_ids=[g.id for g in chosen],
                        team=team,
                        user=user,
                        start=start,
                        end=end,
                        kind=AllocationKind.RESERVATION,
                        reservation=reservation,
                        job_id=None,
                        viewer=user,
                    )
                    audit_record(actor=user, action="reservation.create", target=reservation, data=audit_data)
                if status == ReservationStatus.ACTIVE:
                    _send_holds(reservation.pk)
            return BookingResult(reservation=reservation, warnings=warnings, gpus=list(chosen))
        except Conflict as exc:
            # Retry only a placement that lost a GPU to a booking naming it (those skip the model lock).
            if explicit is not None or "free" in exc.extra or attempt == PLACEMENT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _models_allowed(*, team: Team, limits: dict[date, quota_math.Limits], model_ids: Collection[int]) -> None:
    for month, lim in limits.items():
        refused = [mid for mid in model_ids if not lim.allows_model(mid)]
        if refused:
            names = sorted(GpuModel.objects.filter(pk__in=refused).values_list("name", flat=True))
            allowed = sorted(GpuModel.objects.filter(pk__in=lim.allowed_model_ids or []).values_list("name", flat=True))
            raise Forbidden(
                f"Team {team.slug} may not use {', '.join(names)} in {_month_label(month)}.",
                code="model_not_allowed",
                extra={"allowed_models": allowed},
            )


def _quota_verdicts(
    *,
    team: Team,
    limits: dict[date, quota_math.Limits],
    used: dict[date, quota_math.Amount],
    amounts: dict[date, quota_math.Amount],
    start: datetime,
    end: datetime,
    gpu_count: int,
    check_concurrency: bool = True,
) -> list[dict[str, Any]]:
    """Refuse (QuotaExceeded) or return soft warnings, month by month; the caller holds the usage row locks."""
    tz = selectors.local_tz()
    warnings: list[dict[str, Any]] = []
    intervals: list[tuple[datetime, datetime, int]] | None = None
    for month in sorted(amounts):
        lim = limits[month]
        peak: int | None = None
        if check_concurrency and lim.max_concurrent_gpus is not None:
            if intervals is None:
                intervals = [
                    (lo, hi, 1)
                    for lo, hi in Allocation.objects.active()
                    .filter(team_id=team.pk)
                    .overlapping(start, end)
                    .values_list("start", "end")
                ]
            first, after = quota_math.month_bounds(month, tz)
            peak = quota_math.peak_concurrency(intervals, max(start, first), min(end, after))
        verdict = quota_math.evaluate(
            limits=lim, used=used[month], add=amounts[month], peak=peak, add_gpus=gpu_count if peak is not None else 0
        )
        body = {
            "month": _month_label(month),
            "currency": settings.PORTAL_CURRENCY,
            "remaining": {k: _fmt(v) for k, v in verdict.remaining.items()},
            "requested": {
                "gpu_hours": _fmt(amounts[month].gpu_hours),
                "cost": _fmt(amounts[month].cost),
                "gpus": gpu_count,
            },
        }
        if not verdict.ok:
            raise QuotaExceeded(
                f"This would exceed team {team.slug}'s quota for {_month_label(month)}: {', '.join(verdict.exceeded)}.",
                extra={**body, "exceeded": list(verdict.exceeded)},
            )
        warnings.extend({"code": f"{w}_exceeded", **body} for w in verdict.warnings)
    return warnings


def _book_pg(
    *,
    team: Team,
    user: Any,
    model_id: int | None,
    chosen: Sequence[GpuInfo],
    start: datetime,
    end: datetime,
    status: str,
    note: str,
    now: datetime,
    activated_at: datetime | None,
    rate: Decimal,
    model_ids: Collection[int],
    audit_data: dict[str, Any],
) -> tuple[Reservation, list[dict[str, Any]]]:
    """The PostgreSQL write path of `reservation_create`, inside its transaction: lock the quota rows and the
    GPUs, check, write everything in one statement (apps.booking.fastpath)."""
    amounts = quota_math.hold_amounts(
        start=start, end=end, gpu_count=len(chosen), hourly_rate=rate, tz=selectors.local_tz()
    )
    gpu_ids = [g.id for g in chosen]
    # The quota rows, then the GPUs (services' lock order), in one round trip; a refusal below rolls both back.
    usage, limits = fastpath.lock_usage(team.pk, list(amounts), gpu_ids)
    _models_allowed(team=team, limits=limits, model_ids=model_ids)
    warnings = _quota_verdicts(
        team=team,
        limits=limits,
        used={m: u.used for m, u in usage.items()},
        amounts=amounts,
        start=start,
        end=end,
        gpu_count=len(chosen),
    )
    try:
        rid = fastpath.insert_booking(
            team_id=team.pk, user_id=getattr(user, "pk", None), model_id=model_id, gpus=gpu_ids, start=start, end=end,
            status=status, note=note, now=now, activated_at=activated_at, rate=rate, usage=usage, amounts=amounts,
            audit_data=audit_data,
        )  # fmt: skip
    except IntegrityError as exc:
        if _is_exclusion_violation(exc):
            raise Conflict("Some of these GPUs are already held in that time.", extra={"conflicts": []}) from exc
        raise
    if rid is None:
        raise Conflict(
            "Some of these GPUs are already held in that time.",
            extra={"conflicts": describe_slots(_clashes(gpu_ids, start, end), team_id=team.pk, viewer=user)},
        )
    reservation = Reservation(
        pk=rid,
        team=team,
        user=user,
        gpu_model_id=model_id,
        gpu_count=len(chosen),
        start=start,
        end=end,
        booked_end=end,
        status=status,
        note=note,
        created_at=now,
        activated_at=activated_at,
    )
    reservation._state.adding = False
    reservation._state.db = "default"
    return reservation, warnings


def _amounts(hold: QuotaHold) -> dict[date, quota_math.Amount]:
    return quota_math.hold_amounts(
        start=hold.start, end=hold.end, gpu_count=hold.gpu_count, hourly_rate=hold.hourly_rate, tz=selectors.local_tz()
    )


def _may_end(user: Any, reservation: Reservation) -> bool:
    """Who may cancel or release: admins, the member who booked it, and the team's managers."""
    if getattr(user, "is_staff", False) or reservation.user_id == getattr(user, "pk", None):
        return True
    from apps.accounts.models import Membership

    return Membership.objects.filter(user=user, team_id=reservation.team_id, role=Role.MANAGER).exists()


def reservation_end(*, user: Any, reservation_id: int) -> Reservation:
    """Cancel a reservation that has not started, or release one that has (its GPUs are free from now on: the
    allocations' end is cut to now and the unused rest of the quota hold is given back).

    404 when the user cannot see it, 403 when they may not end it (only the booker, the team's managers and
    admins may), 409 `reservation_ended` when it already ended. Locks the reservation row first."""
    now = timezone.now()
    with transaction.atomic():
        reservation = Reservation.objects.visible_to(user).select_for_update().filter(pk=reservation_id).first()
        if reservation is None:
            raise NotFound("No such reservation.")
        if not _may_end(user, reservation):
            raise Forbidden("Only the member who booked it, a team manager or an admin may end this reservation.")
        if reservation.status in (ReservationStatus.RELEASED, ReservationStatus.CANCELLED) or reservation.end <= now:
            raise Conflict(f"This reservation has already ended ({reservation.status}).", code="reservation_ended")
        allocation_ids = list(reservation.allocations.filter(active=True).values_list("pk", flat=True))
        was_active = reservation.status == ReservationStatus.ACTIVE
        if reservation.start > now:
            if not _transition(reservation.pk, ReservationStatus.CANCELLED, ended_at=now):
                raise Conflict("This reservation changed meanwhile; reload it.", code="reservation_ended")
            allocation_end(allocation_ids=allocation_ids, at=now)
            quota_hold_release(reservation=reservation)
            audit_record(actor=user, action="reservation.cancel", target=reservation, data={"at": _iso(now)})
        else:
            if not _transition(reservation.pk, ReservationStatus.RELEASED, ended_at=now, end=now):
                raise Conflict("This reservation changed meanwhile; reload it.", code="reservation_ended")
            allocation_end(allocation_ids=allocation_ids, at=now)
            quota_hold_update(reservation=reservation, end=now)
            audit_record(
                actor=user,
                action="reservation.release",
                target=reservation,
                data={"at": _iso(now), "booked_end": _iso(reservation.booked_end)},
            )
            rid = reservation.pk
            if was_active:
                _send_holds(rid, until=now)
            transaction.on_commit(lambda: _emit_ended(rid, early=True))
    reservation.refresh_from_db()
    return reservation


def reservations_tick(*, now: datetime | None = None, limit: int = 500) -> dict[str, list[int]]:
    """Activate reservations whose start has come and release those whose end has passed. Each move is a
    conditional UPDATE in its own transaction, so concurrent or repeated ticks do each move once; node agents
    are told about holds and the ended-hook is called after commit, only by the tick that made the move."""
    now = now or timezone.now()
    activated: list[int] = []
    released: list[int] = []
    due_start = Reservation.objects.filter(status=ReservationStatus.BOOKED, start__lte=now, end__gt=now).values_list(
        "pk", flat=True
    )[:limit]
    for rid in list(due_start):
        with transaction.atomic():
            if _transition(rid, ReservationStatus.ACTIVE, activated_at=now):
                reservation = Reservation.objects.get(pk=rid)
                audit_record(actor=None, action="reservation.activate", target=reservation)
                _send_holds(rid)
                activated.append(rid)
    due_end = Reservation.objects.filter(
        status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE], end__lte=now
    ).values_list("pk", flat=True)[:limit]
    for rid in list(due_end):
        with transaction.atomic():
            if _transition(rid, ReservationStatus.RELEASED, ended_at=F("end")):
                reservation = Reservation.objects.get(pk=rid)
                audit_record(actor=None, action="reservation.end", target=reservation)
                transaction.on_commit(lambda rid=rid: _emit_ended(rid, early=False))  # type: ignore[misc]
                released.append(rid)
    return {"activated": activated, "released": released}


# --- Calendar feed ----------------------------------------------------------------------------------------


def calendar_key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def calendar_feed_regenerate(*, user: Any) -> str:
    """A new secret key for the user's iCal feed (the old URL stops working). Returns the key; only its hash
    is stored, so it is shown once."""
    key = secrets.token_urlsafe(32)
    with transaction.atomic():
        feed, _ = CalendarFeed.objects.update_or_create(user=user, defaults={"digest": calendar_key_digest(key)})
        audit_record(actor=user, action="calendar_feed.regenerate", target=feed)
    return key
