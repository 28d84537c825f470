"""Quota accounting: holds counted against a team's monthly usage, checked under the usage rows' locks.

A team's usage of a month is the sum of its `QuotaUsage` rows (slots). A check locks every slot of the months
involved (`lock_usage`), so concurrent checks of one team queue up and together cannot exceed the quota; amounts
counted without a check (teams without amount limits, refunds) go to whichever slot is free (`add_usage`), so
they never queue behind a check."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.booking import quota as quota_math
from apps.booking import selectors
from apps.booking.models import USAGE_SLOTS, Quota, QuotaHold, QuotaUsage, Reservation
from apps.booking.services.locks import GPU_LOCK_NAMESPACE
from apps.booking.services.sql import Params, insert_rows
from apps.core import rawsql
from apps.core.errors import Forbidden, QuotaExceeded, ValidationFailed
from apps.fleet.models import GpuModel
from workers.gpu.mig import profile_fraction


@dataclass(frozen=True)
class QuotaCheck:
    """The hold a booking or job placed on its team's quota, and soft-limit warnings to show."""

    hold: QuotaHold
    warnings: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class UsageRow:
    """A month's usage as a check sees it: `used` summed over its slots, `id` of its slot 0 (which a check writes)."""

    id: int
    month: date
    used: quota_math.Amount


@dataclass(frozen=True)
class LockedUsage:
    """What `lock_usage` read under the locks."""

    usage: dict[date, UsageRow]
    limits: dict[date, quota_math.Limits]
    reservation_id: int | None = None


# The quota rows are locked in (month, slot) order by the first CTE; with GPUs given, the second takes their
# advisory locks (ascending ids) after it: its condition reads all of `u`, so every quota row is locked before
# the first GPU lock (the order of the package docstring), and only when every month's slot 0 exists (else the
# caller creates the missing rows first, which may wait on another booking: it must hold no GPU then). `r`
# reserves the id of the reservation about to be written, so that its rows can be built before the write.
_LOCK_USAGE_SQL = """
WITH u AS MATERIALIZED (
    SELECT u.id, u.month, u.gpu_hours, u.cost, u.slot FROM booking_quotausage u
    WHERE u.team_id = %(team)s AND u.month = ANY(%(months)s) ORDER BY u.month, u.slot FOR UPDATE OF u
), g AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(%(ns)s, x)) AS n FROM unnest(%(gpus)s::int[]) AS x
    WHERE (SELECT count(DISTINCT u.month) FROM u WHERE u.slot = 0) = cardinality(%(months)s::date[])
), r AS MATERIALIZED (
    SELECT CASE WHEN %(reserve)s THEN nextval(pg_get_serial_sequence('booking_reservation', 'id')) END AS id
)
SELECT u.id, u.month, u.gpu_hours, u.cost,
       (SELECT coalesce(json_agg(json_build_object(
                   'month', q.month, 'gpu_hours', q.gpu_hours::text, 'max_concurrent_gpus', q.max_concurrent_gpus,
                   'budget_soft', q.budget_soft::text, 'budget_hard', q.budget_hard::text,
                   'models', ARRAY(SELECT am.gpumodel_id FROM booking_quota_allowed_models am
                                   WHERE am.quota_id = q.id))),
                '[]')
        FROM booking_quota q WHERE q.team_id = %(team)s AND (q.month = ANY(%(months)s) OR q.month IS NULL)),
       u.slot, (SELECT n FROM g), (SELECT id FROM r)
FROM u ORDER BY u.month, u.slot
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
    team_id: int, months: Sequence[date], gpu_ids: Sequence[int] = (), *, reserve_reservation_id: bool = False
) -> LockedUsage:
    """Lock the team's QuotaUsage rows (every slot) of `months` (creating slot 0 where missing) in (month, slot)
    order, read the limits that apply to each month and, with `gpu_ids`, take the GPUs' advisory locks after
    them (what `locks.lock_gpus` does), in one statement; needs a transaction. `reserve_reservation_id`: also
    draw the id of a reservation about to be written."""
    wanted = sorted(set(months))
    gpus = sorted(set(gpu_ids))
    params: dict[str, Any] = {
        "team": team_id,
        "months": wanted,
        "ns": GPU_LOCK_NAMESPACE,
        "gpus": gpus,
        "reserve": reserve_reservation_id,
    }
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_USAGE_SQL, params)
        rows = cursor.fetchall()
        if {r[1] for r in rows if r[5] == 0} != set(wanted):
            QuotaUsage.objects.bulk_create(
                [QuotaUsage(team_id=team_id, month=m, slot=0) for m in wanted], ignore_conflicts=True
            )
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
    raw = rows[0][4]
    limits = _limits_from_json(raw if isinstance(raw, list) else [], wanted)
    return LockedUsage(usage=usage, limits=limits, reservation_id=rows[0][7])


def usage_add_sql(
    params: Params,
    usage: Mapping[date, UsageRow],
    amounts: Mapping[date, quota_math.Amount],
    *,
    guard: str = "",
) -> str:
    """An UPDATE adding each month's amount to its usage row (`usage[month].id`), its values added to `params`.
    `guard`: a further condition (e.g. that the rest of a statement wrote)."""
    months = sorted(amounts)
    ids = params([usage[m].id for m in months], "bigint[]")
    hours = params([amounts[m].gpu_hours for m in months], "numeric[]")
    costs = params([amounts[m].cost for m in months], "numeric[]")
    # `guard` is the caller's SQL, never a value.
    return (
        f"UPDATE booking_quotausage q SET gpu_hours = q.gpu_hours + d.h, cost = q.cost + d.c, "  # noqa: S608
        f"updated_at = {params(timezone.now(), 'timestamptz')} "
        f"FROM unnest({ids}, {hours}, {costs}) AS d(id, h, c) WHERE q.id = d.id {guard}"
    )


# Add to the first usage row of the month that no one holds (a job end of the same team may be committing on
# another); when all are held, to a new slot.
_ADD_USAGE_FREE_SLOT_SQL = """
UPDATE booking_quotausage SET gpu_hours = gpu_hours + %(h)s, cost = cost + %(c)s, updated_at = %(now)s
WHERE id = (SELECT id FROM booking_quotausage WHERE team_id = %(team)s AND month = %(month)s
            ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
"""
_USAGE_SLOTS_SQL = "SELECT array_agg(slot) FROM booking_quotausage WHERE team_id = %(team)s AND month = %(month)s"
_ADD_ON_CONFLICT = (
    "ON CONFLICT (team_id, month, slot) DO UPDATE SET gpu_hours = booking_quotausage.gpu_hours + EXCLUDED.gpu_hours, "
    "cost = booking_quotausage.cost + EXCLUDED.cost, updated_at = EXCLUDED.updated_at"
)


def add_usage(team_id: int, deltas: Mapping[date, quota_math.Amount]) -> None:
    """Add `deltas` to the team's usage without a check (a team without amount limits, a refund): no
    SELECT ... FOR UPDATE, and into whichever slot of the month is free, so concurrent submissions and job ends of
    one team do not queue on one row until each other's commit. A check (`lock_usage`) locks every slot, so it
    waits for these writes and counts them."""
    now = timezone.now()
    with connection.cursor() as cursor:
        for month in sorted(deltas):
            params: dict[str, Any] = {"team": team_id, "month": month, "now": now, "h": deltas[month].gpu_hours}
            params["c"] = deltas[month].cost
            cursor.execute(_ADD_USAGE_FREE_SLOT_SQL, params)
            if cursor.rowcount == 0:
                # No row yet, or every row held: a new slot (slot 0 first). Not an INSERT that conflicts with a
                # held row: that waits for the holder's commit, the very queue this avoids. With every slot taken
                # and held, one at random (then it waits for that one).
                cursor.execute(_USAGE_SLOTS_SQL, params)
                found = cursor.fetchone()
                taken = set(found[0] or ()) if found else set()
                free = [n for n in range(USAGE_SLOTS) if n not in taken]
                row = QuotaUsage(
                    team_id=team_id,
                    month=month,
                    slot=free[0] if free else random.randrange(USAGE_SLOTS),
                    gpu_hours=deltas[month].gpu_hours,
                    cost=deltas[month].cost,
                )
                insert = Params()
                cursor.execute(insert_rows([row], insert, suffix=_ADD_ON_CONFLICT), insert.values)


def _limited(limits: quota_math.Limits) -> bool:
    """Whether any amount limit applies (allowed models are checked without the usage rows)."""
    return any(
        v is not None for v in (limits.gpu_hours, limits.max_concurrent_gpus, limits.budget_soft, limits.budget_hard)
    )


def month_label(month: date) -> str:
    return month.strftime("%Y-%m")


def _fmt(value: Decimal | int | None) -> str | int | None:
    if value is None or isinstance(value, int):
        return value
    return str(quota_math.q4(value))


def quota_gpus(*, gpu_count: int, mig_profile: str = "", gpu_share: Decimal | None = None) -> Decimal:
    """The GPUs a request counts against the quota before it is placed: a share its fraction of one GPU,
    `gpu_count` MIG instances the profile's compute fraction each (`profile_fraction`, from which an instance's
    `Gpu.capacity`, and so what billing charges, is derived: 1g = 1/7), whole GPUs their count."""
    if gpu_share is not None:
        return quota_math.held_gpus(Decimal(gpu_share))
    if mig_profile:
        fraction = profile_fraction(mig_profile)
        return quota_math.held_gpus(Decimal(fraction.numerator) / Decimal(fraction.denominator)) * gpu_count
    return Decimal(gpu_count)


def models_allowed(*, team: Team, limits: Mapping[date, quota_math.Limits], model_ids: Collection[int]) -> None:
    """Refuse (403 `model_not_allowed`) a model that the limits of any month do not allow."""
    for month, lim in sorted(limits.items()):
        refused = [mid for mid in model_ids if not lim.allows_model(mid)]
        if refused:
            names = sorted(GpuModel.objects.filter(pk__in=refused).values_list("name", flat=True))
            allowed = sorted(GpuModel.objects.filter(pk__in=lim.allowed_model_ids or []).values_list("name", flat=True))
            raise Forbidden(
                f"Team {team.slug} may not use {', '.join(names)} in {month_label(month)}.",
                code="model_not_allowed",
                extra={"allowed_models": allowed},
            )


def quota_models_check(
    *,
    team: Team,
    months: Sequence[date],
    gpu_model_ids: Collection[int],
    quotas: Mapping[date, Quota | None] | None = None,
) -> None:
    """Refuse (403 `model_not_allowed`) a model the team's quota for any of `months` does not allow."""
    quotas = quotas if quotas is not None else selectors.quotas_for(team_id=team.pk, months=months)
    models_allowed(team=team, limits={m: selectors.limits_of(quotas[m]) for m in months}, model_ids=gpu_model_ids)


def quota_verdicts(
    *,
    team: Team,
    limits: Mapping[date, quota_math.Limits],
    used: Mapping[date, quota_math.Amount],
    amounts: Mapping[date, quota_math.Amount],
    start: datetime,
    end: datetime,
    gpus: Decimal | int,
    check_concurrency: bool = True,
) -> list[dict[str, Any]]:
    """Refuse (QuotaExceeded) or return soft warnings, month by month; the caller holds the usage row locks.
    `gpus`: what the booking holds, a part of a GPU counting its fraction."""
    tz = selectors.local_tz()
    warnings: list[dict[str, Any]] = []
    intervals: list[tuple[datetime, datetime, Decimal]] | None = None
    for month in sorted(amounts):
        lim = limits[month]
        peak: Decimal | None = None
        if check_concurrency and lim.max_concurrent_gpus is not None:
            if intervals is None:
                intervals = selectors.team_held_intervals(team_id=team.pk, start=start, end=end)
            first, after = quota_math.month_bounds(month, tz)
            peak = quota_math.peak_concurrency(intervals, max(start, first), min(end, after))
        verdict = quota_math.evaluate(
            limits=lim, used=used[month], add=amounts[month], peak=peak, add_gpus=gpus if peak is not None else 0
        )
        body = {
            "month": month_label(month),
            "currency": settings.PORTAL_CURRENCY,
            "remaining": quota_math.remaining_out(verdict.remaining),
            "requested": {
                "gpu_hours": _fmt(amounts[month].gpu_hours),
                "cost": _fmt(amounts[month].cost),
                "gpus": quota_math.gpu_number(gpus),
            },
        }
        if not verdict.ok:
            raise QuotaExceeded(
                f"This would exceed team {team.slug}'s quota for {month_label(month)}: {', '.join(verdict.exceeded)}.",
                extra={**body, "exceeded": list(verdict.exceeded)},
            )
        warnings.extend({"code": f"{w}_exceeded", **body} for w in verdict.warnings)
    return warnings


def hold_row(
    *,
    team_id: int,
    kind: str,
    gpu_count: int,
    hourly_rate: Decimal,
    start: datetime,
    end: datetime,
    reservation_id: int | None = None,
    job_id: int | None = None,
    gpus: Decimal | int | None = None,
) -> QuotaHold:
    """The unsaved hold of a reservation or job: what every writer of holds inserts. `gpus`: the GPUs it counts
    (a part its fraction; default `gpu_count` whole GPUs)."""
    return QuotaHold(
        team_id=team_id,
        kind=kind,
        reservation_id=reservation_id,
        job_id=job_id,
        gpu_count=gpu_count,
        gpus=quota_math.held_gpus(gpu_count if gpus is None else gpus),
        hourly_rate=hourly_rate,
        start=start,
        end=end,
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
    quotas: Mapping[date, Quota | None] | None = None,
    gpus: Decimal | int | None = None,
) -> QuotaCheck:
    """`quota_check_and_hold` inside the caller's transaction, without a savepoint: a refusal ends it."""
    tz = selectors.local_tz()
    counted = quota_math.held_gpus(gpu_count if gpus is None else gpus)
    amounts = quota_math.hold_amounts(start=start, end=end, gpu_count=counted, hourly_rate=hourly_rate, tz=tz)
    months = sorted(amounts)
    # The limits are configuration (the usage lock does not guard them): read before taking it, or taken from the
    # caller, who read them for these months already (a job's submission).
    if quotas is None or any(m not in quotas for m in months):
        quotas = selectors.quotas_for(team_id=team.pk, months=months)
    if gpu_model_ids:
        quota_models_check(team=team, months=months, gpu_model_ids=gpu_model_ids, quotas=quotas)
    limits = {m: selectors.limits_of(quotas[m]) for m in months}
    # The hold before the usage rows, so the usage lock is held for as little as possible: from the check to the
    # caller's commit (under load, waits for it were most of a job submission's database time).
    hold = hold_row(
        team_id=team.pk,
        kind=kind,
        reservation_id=reservation.pk if reservation is not None else None,
        job_id=job_id,
        gpu_count=gpu_count,
        gpus=counted,
        hourly_rate=hourly_rate,
        start=start,
        end=end,
    )
    hold.save(force_insert=True)
    if not any(_limited(limit) for limit in limits.values()):
        # Nothing to check against: count it (the UPDATE takes the row lock, only until the commit).
        add_usage(team.pk, amounts)
        return QuotaCheck(hold=hold, warnings=[])
    usage = lock_usage(team.pk, months).usage
    warnings = quota_verdicts(
        team=team,
        limits=limits,
        used={m: usage[m].used for m in months},
        amounts=amounts,
        start=start,
        end=end,
        gpus=counted,
        check_concurrency=check_concurrency,
    )
    add = Params()
    with connection.cursor() as cursor:
        cursor.execute(usage_add_sql(add, usage, amounts), add.values)
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
    gpus: Decimal | int | None = None,
) -> QuotaCheck:
    """Count `gpu_count` GPUs over [start, end) at `hourly_rate` (the price of all of them per hour) against
    `team`'s quota of every month they touch, or refuse. `gpus`: what they count when they are parts of GPUs
    (`quota_gpus`: a quarter of a GPU 0.25, a 1g MIG instance 1/7); default `gpu_count`.

    Locks the team's QuotaUsage rows of those months (`SELECT ... FOR UPDATE`) until the caller's transaction
    ends, so concurrent checks of one team queue up and together cannot exceed the quota; run it inside the
    transaction that writes the booking or job (there it runs in a savepoint, so a refusal can be caught).
    `check_concurrency`: also refuse when the team would hold more than `max_concurrent_gpus` at some instant
    (counting active allocations; a queued job has none yet, so jobs pass False at submit and call
    `quota_concurrency_check` when they are placed). Raises `QuotaExceeded` (403, with `remaining`, `month`,
    `exceeded`) or `Forbidden` (`model_not_allowed`). Returns the hold and soft-limit warnings.
    `savepoint=False`: for a caller whose whole transaction ends with a refusal anyway (two round trips less).
    """
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
            gpus=gpus,
        )


def quota_concurrency_check(*, team: Team, start: datetime, end: datetime, gpu_count: Decimal | int) -> None:
    """Refuse (QuotaExceeded) when `team` holding `gpu_count` more GPUs over [start, end) would exceed its
    `max_concurrent_gpus` in some month; parts of GPUs count their fractions (the sum of the devices'
    `Gpu.capacity`). Takes the same QuotaUsage row locks as `quota_check_and_hold`; call it in the transaction
    that then calls `allocations_create`."""
    tz = selectors.local_tz()
    months = [m for m, _ in quota_math.split_by_month(start, end, tz)]
    with transaction.atomic():
        lock_usage(team.pk, months)
        quotas = selectors.quotas_for(team_id=team.pk, months=months)
        for month in months:
            limits = selectors.limits_of(quotas[month])
            if limits.max_concurrent_gpus is None:
                continue
            first, after = quota_math.month_bounds(month, tz)
            lo, hi = max(start, first), min(end, after)
            peak = selectors.team_peak_gpus(team_id=team.pk, start=lo, end=hi)
            if quota_math.q4(peak + Decimal(gpu_count)) > limits.max_concurrent_gpus:
                raise QuotaExceeded(
                    f"Team {team.slug} may hold at most {limits.max_concurrent_gpus} GPUs at once.",
                    extra={
                        "month": month_label(month),
                        "exceeded": ["concurrent_gpus"],
                        "remaining": quota_math.remaining_out({"concurrent_gpus": limits.max_concurrent_gpus - peak}),
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
    # Column list from the model's metadata; the id is a parameter.
    sql = f"SELECT {cols.sql} FROM booking_quotahold h WHERE h.{column} = %s ORDER BY h.id LIMIT 1 FOR UPDATE"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [value])
        row = cursor.fetchone()
    return cols.load(row) if row is not None else None


def quota_hold_update(
    *,
    reservation: Reservation | None = None,
    job_id: int | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    release: bool = False,
    gpus: Decimal | None = None,
) -> QuotaHold | None:
    """Move, cut or (release=True) drop the quota hold of a reservation or job, giving back (or, when it grows,
    counting without a check) the difference in each month. A job that finishes calls it with its real
    [start, end); a cancelled reservation or job with release=True; a job that asked for any MIG instance with
    enough memory, when it starts, with `gpus`: the fraction of a GPU it got (the hold counted the smallest profile,
    and its hourly rate scales with it). Locks the hold row, then the QuotaUsage rows. Idempotent; returns the
    hold (None if there is none)."""
    tz = selectors.local_tz()
    with transaction.atomic(savepoint=False):
        hold = _find_hold(reservation=reservation, job_id=job_id)
        if hold is None or not hold.active:
            return hold
        before = quota_math.hold_amounts(
            start=hold.start, end=hold.end, gpu_count=hold.gpus, hourly_rate=hold.hourly_rate, tz=tz
        )
        new_start, new_end = start or hold.start, end or hold.end
        if gpus is not None and gpus != hold.gpus and hold.gpus > 0:
            hold.hourly_rate = (hold.hourly_rate * gpus / hold.gpus).quantize(Decimal("0.0001"))
            hold.gpus = gpus
        if release or new_end <= new_start:
            after: dict[date, quota_math.Amount] = {}
            hold.active = False
        else:
            after = quota_math.hold_amounts(
                start=new_start, end=new_end, gpu_count=hold.gpus, hourly_rate=hold.hourly_rate, tz=tz
            )
            hold.start, hold.end = new_start, new_end
        deltas = quota_math.amounts_delta(before, after)
        with connection.cursor() as cursor:
            cursor.execute(
                'UPDATE booking_quotahold SET start = %s, "end" = %s, active = %s, gpus = %s, hourly_rate = %s '
                "WHERE id = %s",
                [hold.start, hold.end, hold.active, hold.gpus, hold.hourly_rate, hold.pk],
            )
        if deltas:
            # Last, and without SELECT ... FOR UPDATE (nothing is checked): the team's usage rows stay locked only
            # from here to the caller's commit. Every job exit of the team passes here.
            add_usage(hold.team_id, deltas)
    return hold


def quota_hold_release(*, reservation: Reservation | None = None, job_id: int | None = None) -> QuotaHold | None:
    """Give back everything a reservation's or job's hold counted (cancelled before it used anything)."""
    return quota_hold_update(reservation=reservation, job_id=job_id, release=True)
