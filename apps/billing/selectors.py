"""Reads for billing: prices, what is not billed yet, live month-to-date usage, budgets, reports, chart data.

Month-to-date figures are live: the ledger's rows of the month plus the pieces of allocations not written yet
(running ones up to now, finished ones still inside BILLING_CLOSE_LAG_S), computed with the same functions the
ledger closer uses, so a live figure equals the rows it becomes.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.apps import apps as django_apps
from django.conf import settings
from django.db import connection, transaction
from django.db.models import DecimalField, Exists, F, IntegerField, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from apps.accounts.models import Role, Team
from apps.accounts.scoping import managed_team_ids_of, team_ids_of
from apps.billing import costing
from apps.billing.costing import Piece, PricePoint
from apps.billing.models import (
    MonthClose,
    MonthStatus,
    Notification,
    Price,
    SourceKind,
    UsageRecord,
)
from apps.booking.models import Allocation, AllocationKind
from apps.core.errors import Forbidden, NotFound, ValidationFailed
from apps.fleet.models import Gpu, GpuModel

ZERO = Decimal(0)
HOURS_PLACES = Decimal("0.001")
UTIL_PLACES = Decimal("0.0001")
_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def local_tz() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


def current_month(*, now: datetime | None = None) -> date:
    return costing.month_of(now or timezone.now(), local_tz())


def parse_month(value: str | None, *, now: datetime | None = None, field_name: str = "month") -> date:
    """`YYYY-MM` (default: the current month) as the month's first day; malformed or future months are refused."""
    this_month = current_month(now=now)
    if value in (None, ""):
        return this_month
    match = _MONTH_RE.match(str(value))
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1970:
        raise ValidationFailed("month must look like YYYY-MM.", fields={field_name: ["Expected YYYY-MM."]})
    month = date(int(match.group(1)), int(match.group(2)), 1)
    if month > this_month:
        raise ValidationFailed(
            f"{value} is in the future; there is no usage to show yet.", fields={field_name: ["A future month."]}
        )
    return month


def month_label(month: date) -> str:
    return f"{month:%Y-%m}"


@contextlib.contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent view of the ledger and the allocations for the queries inside (PostgreSQL), so a row the
    closer writes meanwhile is counted once: either as a row or as a live piece, never both or neither."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


# --- Prices ----------------------------------------------------------------------------------------------------


def price_points(*, gpu_model_ids: Iterable[int] | None = None) -> dict[int, list[PricePoint]]:
    """Each GPU model's price timeline, sorted."""
    qs = Price.objects.all()
    if gpu_model_ids is not None:
        qs = qs.filter(gpu_model_id__in=list(gpu_model_ids))
    out: dict[int, list[PricePoint]] = defaultdict(list)
    for model_id, valid_from, price in qs.order_by("gpu_model_id", "valid_from").values_list(
        "gpu_model_id", "valid_from", "hourly_price"
    ):
        out[model_id].append(PricePoint(valid_from, price))
    return {k: costing.normalize_prices(v) for k, v in out.items()}


def list_prices(*, gpu_model_ids: Iterable[int] | None = None) -> dict[int, Decimal]:
    """The fleet's list prices (GpuModel.hourly_price): what applies before a model's first Price row."""
    qs = GpuModel.objects.all()
    if gpu_model_ids is not None:
        qs = qs.filter(pk__in=list(gpu_model_ids))
    return dict(qs.values_list("pk", "hourly_price"))


@dataclass(frozen=True)
class PriceBook:
    """Price timelines and fallbacks of some GPU models, loaded once for a batch of computations."""

    points: dict[int, list[PricePoint]]
    fallbacks: dict[int, Decimal]

    def split(self, gpu_model_id: int, start: datetime, end: datetime) -> list[Piece]:
        return costing.split(
            start,
            end,
            prices=self.points.get(gpu_model_id, []),
            tz=local_tz(),
            fallback_price=self.fallbacks.get(gpu_model_id, ZERO),
        )

    def price_at(self, gpu_model_id: int, at: datetime) -> Decimal:
        price = costing.price_at(self.points.get(gpu_model_id, []), at, self.fallbacks.get(gpu_model_id, ZERO))
        return price if price is not None else ZERO


def price_book(*, gpu_model_ids: Iterable[int] | None = None) -> PriceBook:
    ids = None if gpu_model_ids is None else set(gpu_model_ids)
    return PriceBook(points=price_points(gpu_model_ids=ids), fallbacks=list_prices(gpu_model_ids=ids))


def price_at(*, gpu_model_id: int, at: datetime | None = None) -> Decimal:
    """The hourly price of a GPU model at `at` (default now)."""
    return price_book(gpu_model_ids=[gpu_model_id]).price_at(gpu_model_id, at or timezone.now())


def estimate_cost(*, gpu_model_id: int, start: datetime, end: datetime, gpu_count: int = 1) -> Decimal:
    """What holding `gpu_count` GPUs of a model over [start, end) will cost, across price changes and months.
    For quota checks of new bookings and jobs (apps.booking)."""
    book = price_book(gpu_model_ids=[gpu_model_id])
    return sum((p.cost for p in book.split(gpu_model_id, start, end)), ZERO) * gpu_count


def prices_visible_to(*, user: Any) -> QuerySet[Price]:
    return Price.objects.visible_to(user).select_related("gpu_model").order_by("gpu_model__name", "valid_from")


# --- Months --------------------------------------------------------------------------------------------------


def closed_months() -> set[date]:
    return set(MonthClose.objects.filter(status=MonthStatus.CLOSED).values_list("month", flat=True))


def month_close_of(month: date) -> MonthClose | None:
    return MonthClose.objects.filter(month=month).first()


def open_since() -> datetime | None:
    """Allocations that ended before this instant need no more billing: it is the start of the first month, from
    the earliest closed one on, that is not closed (months before the first close predate it and count as done).
    None when no month was ever closed."""
    closed = sorted(m for m, s in MonthClose.objects.values_list("month", "status") if s == MonthStatus.CLOSED)
    if not closed:
        return None
    # The first month from the earliest closed one on that is not closed (a re-opened month, a gap, or the month
    # after the latest close).
    month = closed[0]
    done = set(closed)
    while month in done:
        month = costing.next_month(month)
    return costing.month_bounds(month, local_tz())[0]


# --- What is not billed yet -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenAllocation:
    """An active allocation with some of its time not in the ledger yet (plain data for the cost functions)."""

    id: int
    gpu_id: int
    gpu_model_id: int
    team_id: int
    user_id: int | None
    source: str
    source_id: int
    start: datetime
    end: datetime  # billable end: its end, or now while it runs


def billable_allocations() -> QuerySet[Allocation]:
    """The allocations that bill: active rows. Booking marks a reservation cancelled before it started (or a job
    allocation that never ran) inactive; one released early or a job that ended keeps its row, cut to that time."""
    return Allocation.objects.filter(active=True)


def unbilled_allocations(
    *,
    now: datetime,
    window: tuple[datetime, datetime] | None = None,
    team_ids: Iterable[int] | None = None,
    allocation_ids: Iterable[int] | None = None,
    since: datetime | None = None,
) -> list[OpenAllocation]:
    """Active allocations that started before `now` and whose last piece is not in the ledger (no row ends where
    the allocation ends): running ones, and finished ones the closer has not written yet."""
    fully_billed = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), end=OuterRef("end"))
    qs = billable_allocations().filter(start__lt=now).exclude(Exists(fully_billed))
    if window is not None:
        qs = qs.filter(start__lt=window[1], end__gt=window[0])
    if since is not None:
        qs = qs.filter(end__gt=since)
    if team_ids is not None:
        qs = qs.filter(team_id__in=list(team_ids))
    if allocation_ids is not None:
        qs = qs.filter(pk__in=list(allocation_ids))
    out: list[OpenAllocation] = []
    for row in qs.values(
        "id", "gpu_id", "gpu__model_id", "team_id", "user_id", "kind", "reservation_id", "job_id", "start", "end"
    ):
        source_id: int | None
        if row["kind"] == AllocationKind.RESERVATION:
            source, source_id = SourceKind.RESERVATION, row["reservation_id"]
        else:
            source, source_id = SourceKind.JOB, row["job_id"]
        if source_id is None:
            continue  # a job allocation without its job id cannot be keyed; booking's constraint makes it rare
        out.append(
            OpenAllocation(
                id=row["id"],
                gpu_id=row["gpu_id"],
                gpu_model_id=row["gpu__model_id"],
                team_id=row["team_id"],
                user_id=row["user_id"],
                source=str(source),
                source_id=int(source_id),
                start=row["start"],
                end=min(row["end"], now),
            )
        )
    return out


def billed_starts(allocation_ids: Iterable[int], *, month: date | None = None) -> set[tuple[int, datetime]]:
    """(allocation id, piece start) of the ledger rows these allocations already have."""
    ids = list(allocation_ids)
    if not ids:
        return set()
    qs = UsageRecord.objects.filter(allocation_id__in=ids)
    if month is not None:
        qs = qs.filter(month=month)
    return {(a, s) for a, s in qs.values_list("allocation_id", "start")}


def unbilled_pieces(
    allocations: Sequence[OpenAllocation], *, book: PriceBook, month: date | None = None
) -> list[tuple[OpenAllocation, Piece]]:
    """The pieces of these allocations (up to their billable end) that have no ledger row, optionally only one
    month's."""
    billed = billed_starts([a.id for a in allocations], month=month)
    out: list[tuple[OpenAllocation, Piece]] = []
    for alloc in allocations:
        for piece in book.split(alloc.gpu_model_id, alloc.start, alloc.end):
            if month is not None and piece.month != month:
                continue
            if (alloc.id, piece.start) not in billed:
                out.append((alloc, piece))
    return out


# --- Utilization (the one place that reads telemetry) ----------------------------------------------------------


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _rollup_means(
    table: str, time_col: str, segments: Sequence[tuple[int, int, datetime, datetime]]
) -> dict[int, Decimal]:
    """{segment index: sample-weighted mean util (0..1)} of the rollups in `table` whose bucket starts inside each
    (index, gpu id, lo, hi). One query per chunk of 500 segments (a VALUES list), each segment one index range
    scan on the rollups' (gpu, time) unique index."""
    out: dict[int, Decimal] = {}
    ops = connection.ops
    pg = connection.vendor == "postgresql"
    row_sql = "(%s::int, %s::bigint, %s::timestamptz, %s::timestamptz)" if pg else "(%s, %s, %s, %s)"
    for i in range(0, len(segments), 500):
        chunk = segments[i : i + 500]
        params: list[Any] = []
        for index, gpu_id, lo, hi in chunk:
            params += [index, gpu_id, ops.adapt_datetimefield_value(lo), ops.adapt_datetimefield_value(hi)]
        values = ", ".join([row_sql] * len(chunk))
        match = f"r.gpu_id = seg.gpu_id AND r.{time_col} >= seg.lo AND r.{time_col} < seg.hi"
        match += " AND r.util_mean IS NOT NULL AND r.samples > 0"
        # Per segment, an index range scan on (gpu, time): a join over VALUES would let PostgreSQL hash the
        # whole rollup table instead (bench/billing_report.py: 0.4 s against 2M rows for 500 segments).
        if pg:
            sql = (
                f"WITH seg(i, gpu_id, lo, hi) AS (VALUES {values}) "  # noqa: S608 - fixed names
                f"SELECT seg.i, agg.w, agg.n FROM seg CROSS JOIN LATERAL "
                f"(SELECT SUM(r.util_mean * r.samples) AS w, SUM(r.samples) AS n FROM {table} r WHERE {match}) agg"
            )
        else:
            sql = (
                f"WITH seg(i, gpu_id, lo, hi) AS (VALUES {values}) "  # noqa: S608 - fixed names
                f"SELECT seg.i, (SELECT SUM(r.util_mean * r.samples) FROM {table} r WHERE {match}), "
                f"(SELECT SUM(r.samples) FROM {table} r WHERE {match}) FROM seg"
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            for index, weighted, samples in cursor.fetchall():
                if samples and weighted is not None:
                    mean = Decimal(str(float(weighted) / float(samples))) / 100
                    out[int(index)] = min(max(mean, ZERO), Decimal(1)).quantize(Decimal("0.000001"))
    return out


def mean_utilizations(segments: Sequence[tuple[int, datetime, datetime]]) -> list[Decimal | None]:
    """Mean utilization (0..1) of each (gpu id, start, end) from telemetry's rollups, weighted by sample count:
    the per-minute rollups whose minute starts in the segment, else (minute rows are kept only days) the hourly
    ones. None where the GPU reported nothing: the row's idle cost is then unknown, and reports say so."""
    if not segments:
        return []
    try:
        minute_model = django_apps.get_model("telemetry", "GpuRollup")
        hour_model = django_apps.get_model("telemetry", "GpuHourlyRollup")
    except LookupError:
        return [None] * len(segments)
    by_minute = _rollup_means(
        minute_model._meta.db_table,
        "minute",
        [(i, gpu, _floor_minute(lo), hi) for i, (gpu, lo, hi) in enumerate(segments)],
    )
    missing = [(i, gpu, _floor_hour(lo), hi) for i, (gpu, lo, hi) in enumerate(segments) if i not in by_minute]
    by_hour = _rollup_means(hour_model._meta.db_table, "hour", missing) if missing else {}
    return [by_minute.get(i, by_hour.get(i)) for i in range(len(segments))]


# --- Month-to-date usage --------------------------------------------------------------------------------------


@dataclass
class MonthUsage:
    """A team's usage in one month: ledger rows plus live pieces (full precision; round only to show)."""

    team_id: int
    month: date
    gpu_seconds: int = 0
    cost: Decimal = ZERO
    live_gpu_seconds: int = 0
    live_cost: Decimal = ZERO
    running_gpus: int = 0
    running_hourly: Decimal = ZERO  # what the GPUs held right now cost per hour
    by_day: dict[date, Decimal] = field(default_factory=dict)

    @property
    def gpu_hours(self) -> Decimal:
        return Decimal(self.gpu_seconds) / costing.SECONDS_PER_HOUR


def teams_month_usage(
    *,
    team_ids: Iterable[int] | None = None,
    month: date | None = None,
    now: datetime | None = None,
    by_day: bool = False,
) -> dict[int, MonthUsage]:
    """Month-to-date usage per team (default: the current month, teams with any usage in it)."""
    now = now or timezone.now()
    month = month or current_month(now=now)
    first, after = costing.month_bounds(month, local_tz())
    ids = None if team_ids is None else list(team_ids)
    out: dict[int, MonthUsage] = {}
    if ids is not None:
        out = {tid: MonthUsage(team_id=tid, month=month) for tid in ids}
    with _snapshot():
        rows = UsageRecord.objects.filter(month=month)
        if ids is not None:
            rows = rows.filter(team_id__in=ids)
        group = ("team_id", "day") if by_day else ("team_id",)
        for row in rows.values(*group).annotate(seconds=Sum("gpu_seconds"), cost=Sum("cost")).order_by():
            usage = out.setdefault(row["team_id"], MonthUsage(team_id=row["team_id"], month=month))
            usage.gpu_seconds += int(row["seconds"] or 0)
            usage.cost += Decimal(row["cost"] or 0)
            if by_day:
                usage.by_day[row["day"]] = usage.by_day.get(row["day"], ZERO) + Decimal(row["cost"] or 0)
        if now > first:
            allocations = unbilled_allocations(now=now, window=(first, after), team_ids=ids)
            book = price_book(gpu_model_ids={a.gpu_model_id for a in allocations})
            for alloc, piece in unbilled_pieces(allocations, book=book, month=month):
                usage = out.setdefault(alloc.team_id, MonthUsage(team_id=alloc.team_id, month=month))
                usage.gpu_seconds += piece.seconds
                usage.cost += piece.cost
                usage.live_gpu_seconds += piece.seconds
                usage.live_cost += piece.cost
                if by_day:
                    usage.by_day[piece.day] = usage.by_day.get(piece.day, ZERO) + piece.cost
            if first <= now < after:
                for alloc in allocations:
                    if alloc.end >= now:  # running this instant
                        usage = out[alloc.team_id]
                        usage.running_gpus += 1
                        usage.running_hourly += book.price_at(alloc.gpu_model_id, now)
    return out


def team_month_usage(*, team_id: int, month: date | None = None, now: datetime | None = None) -> MonthUsage:
    """One team's month-to-date usage (ledger + live accrual)."""
    return teams_month_usage(team_ids=[team_id], month=month, now=now)[team_id]


def team_month_cost(*, team_id: int, month: date | None = None, now: datetime | None = None) -> Decimal:
    """A team's cost in `month` (default: the current month) up to `now`, including what running allocations have
    accrued and is not in the ledger yet. Full precision. The figure booking's budget checks compare with."""
    return team_month_usage(team_id=team_id, month=month, now=now).cost


def team_month_costs(*, team_id: int, months: Sequence[date], now: datetime | None = None) -> dict[date, Decimal]:
    """`team_month_cost` for several months at once (a booking across a month boundary checks each month)."""
    now = now or timezone.now()
    return {m: teams_month_usage(team_ids=[team_id], month=m, now=now)[team_id].cost for m in months}


def source_usage(*, source: str, source_id: int, now: datetime | None = None) -> tuple[int, Decimal]:
    """(GPU-seconds, cost) of one job or reservation so far, every month, ledger plus live pieces (full
    precision). For job and reservation pages."""
    now = now or timezone.now()
    with _snapshot():
        agg = UsageRecord.objects.filter(source=source, source_id=source_id).aggregate(
            seconds=Sum("gpu_seconds"), cost=Sum("cost")
        )
        seconds, cost = int(agg["seconds"] or 0), Decimal(agg["cost"] or 0)
        kind_filter = (
            Q(kind=AllocationKind.RESERVATION, reservation_id=source_id)
            if source == SourceKind.RESERVATION
            else Q(kind=AllocationKind.JOB, job_id=source_id)
        )
        ids = billable_allocations().filter(kind_filter).values_list("pk", flat=True)
        allocations = unbilled_allocations(now=now, allocation_ids=list(ids))
        book = price_book(gpu_model_ids={a.gpu_model_id for a in allocations})
        for _, piece in unbilled_pieces(allocations, book=book):
            seconds += piece.seconds
            cost += piece.cost
    return seconds, cost


def teams_with_unbilled_time(*, now: datetime) -> list[int]:
    """Teams whose month-to-date figures move: a running allocation, or one not fully written yet."""
    first, _after = costing.month_bounds(current_month(now=now), local_tz())
    fully_billed = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), end=OuterRef("end"))
    return sorted(
        set(
            billable_allocations()
            .filter(start__lt=now, end__gt=first)
            .exclude(Exists(fully_billed))
            .values_list("team_id", flat=True)
            .distinct()
        )
    )


# --- Budgets -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    soft: Decimal | None
    hard: Decimal | None

    @property
    def reference(self) -> Decimal | None:
        """The budget alerts are measured against: the soft budget, the one a team plans with; else the hard."""
        return self.soft if self.soft is not None else self.hard


def team_budget(*, team_id: int, month: date) -> Budget:
    from apps.booking.selectors import quotas_for

    quota = quotas_for(team_id=team_id, months=[month])[month]
    if quota is None:
        return Budget(None, None)
    return Budget(quota.budget_soft, quota.budget_hard)


def usage_summary(*, team: Team, now: datetime | None = None) -> dict[str, Any]:
    """Month-to-date usage and cost of a team, for GET /api/v1/teams/{slug}/ and the team socket."""
    now = now or timezone.now()
    usage = team_month_usage(team_id=team.pk, now=now)
    budget = team_budget(team_id=team.pk, month=usage.month)
    return usage_payload(team, usage, budget, now)


def usage_payload(team: Team, usage: MonthUsage, budget: Budget, now: datetime) -> dict[str, Any]:
    first, after = costing.month_bounds(usage.month, local_tz())
    projected = costing.project_month_end(
        spent=usage.cost, month_start=first, month_end=after, now=now, running_hourly=usage.running_hourly
    )
    reference = budget.reference
    return {
        "team": team.slug,
        "month": month_label(usage.month),
        "currency": settings.PORTAL_CURRENCY,
        "gpu_hours": str(_hours(usage.gpu_seconds)),
        "cost": str(costing.to_cents(usage.cost)),
        "accrued_unbilled_cost": str(costing.to_cents(usage.live_cost)),
        "running_gpus": usage.running_gpus,
        "running_hourly_cost": str(costing.to_cents(usage.running_hourly)),
        "projected_month_cost": str(costing.to_cents(projected)),
        "budget_soft": None if budget.soft is None else str(budget.soft),
        "budget_hard": None if budget.hard is None else str(budget.hard),
        "budget_used": None if not reference else str((usage.cost / reference).quantize(UTIL_PLACES)),
        "as_of": now.isoformat(),
    }


def _hours(seconds: int | Decimal) -> Decimal:
    return (Decimal(seconds) / costing.SECONDS_PER_HOUR).quantize(HOURS_PLACES, ROUND_HALF_UP)


# --- Usage rows (GET /api/v1/usage/) ------------------------------------------------------------------------------


def usage_visible_to(
    *,
    user: Any,
    team: str | None = None,
    month: str | None = None,
    source: str | None = None,
    source_id: int | None = None,
    gpu_model: str | None = None,
) -> QuerySet[UsageRecord]:
    """Ledger rows the user may see (admins all, managers their teams', members their own), filtered.
    A team the user cannot see is 404; malformed filters are 400."""
    qs = UsageRecord.objects.visible_to(user).select_related("team", "user", "gpu", "gpu_model")
    if team:
        team_obj = Team.objects.visible_to(user).filter(slug=team).first()
        if team_obj is None:
            raise NotFound(f"No team {team!r} that you belong to.")
        qs = qs.filter(team=team_obj)
    if month:
        qs = qs.filter(month=parse_month(month))
    if source:
        if source not in SourceKind.values:
            raise ValidationFailed(
                "source must be job or reservation.", fields={"source": [f"One of {', '.join(SourceKind.values)}."]}
            )
        qs = qs.filter(source=source)
    if source_id is not None:
        qs = qs.filter(source_id=source_id)
    if gpu_model:
        qs = qs.filter(gpu_model__name=gpu_model)
    return qs.order_by("-start", "-id")


# --- Monthly reports -------------------------------------------------------------------------------------------------


def _agg_annotations() -> dict[str, Any]:
    known = Q(mean_utilization__isnull=False)
    money = DecimalField(max_digits=30, decimal_places=10)
    return {
        "seconds": Sum("gpu_seconds"),
        "cost_sum": Sum("cost"),
        "known_seconds": Sum("gpu_seconds", filter=known, output_field=IntegerField()),
        "util_seconds": Sum(F("gpu_seconds") * F("mean_utilization"), filter=known, output_field=money),
        "idle": Sum(F("cost") - F("cost") * F("mean_utilization"), filter=known, output_field=money),
    }


def _agg_from_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "seconds": int(row["seconds"] or 0),
        "cost": str(Decimal(row["cost_sum"] or 0)),
        "known_seconds": int(row["known_seconds"] or 0),
        "util_seconds": str(Decimal(row["util_seconds"] or 0)),
        "idle_cost": str(Decimal(row["idle"] or 0)),
    }


def _agg_add(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return {
        "seconds": into.get("seconds", 0) + other["seconds"],
        "cost": str(Decimal(into.get("cost", "0")) + Decimal(other["cost"])),
        "known_seconds": into.get("known_seconds", 0) + other["known_seconds"],
        "util_seconds": str(Decimal(into.get("util_seconds", "0")) + Decimal(other["util_seconds"])),
        "idle_cost": str(Decimal(into.get("idle_cost", "0")) + Decimal(other["idle_cost"])),
    }


def report_figures(*, month: date) -> dict[str, Any]:
    """A month's ledger aggregated in SQL, per team by GPU model and by user, at full precision: what a month
    close freezes. Two grouped queries over the month's rows (index billing_usage_month_team) and three small
    name look-ups."""
    base = UsageRecord.objects.filter(month=month).order_by()
    ann = _agg_annotations()
    by_model: list[dict[str, Any]] = [dict(r) for r in base.values("team_id", "gpu_model_id").annotate(**ann)]
    by_user: list[dict[str, Any]] = [dict(r) for r in base.values("team_id", "user_id").annotate(**ann)]
    team_ids = {r["team_id"] for r in by_model}
    teams = {t.pk: t for t in Team.objects.filter(pk__in=team_ids)}
    model_names = dict(GpuModel.objects.filter(pk__in={r["gpu_model_id"] for r in by_model}).values_list("pk", "name"))
    from django.contrib.auth import get_user_model

    user_ids = {r["user_id"] for r in by_user if r["user_id"] is not None}
    usernames = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))
    out: dict[str, Any] = {}
    for tid in sorted(team_ids, key=lambda t: teams[t].slug):
        out[teams[tid].slug] = {"name": teams[tid].name, "team_id": tid, "by_gpu_model": {}, "by_user": {}}
    for row in by_model:
        out[teams[row["team_id"]].slug]["by_gpu_model"][model_names[row["gpu_model_id"]]] = _agg_from_row(row)
    for row in by_user:
        name: str = usernames.get(row["user_id"], "(no user)") if row["user_id"] is not None else "(no user)"
        section = out[teams[row["team_id"]].slug]["by_user"]
        section[name] = _agg_add(section.get(name, {}), _agg_from_row(row))
    return {"month": month_label(month), "teams": out}


def _present(agg: dict[str, Any]) -> dict[str, Any]:
    seconds = int(agg.get("seconds", 0))
    known = int(agg.get("known_seconds", 0))
    util = Decimal(agg.get("util_seconds", "0")) / known if known else None
    return {
        "gpu_hours": str(_hours(seconds)),
        "cost": str(costing.to_cents(Decimal(agg.get("cost", "0")))),
        "idle_cost": str(costing.to_cents(Decimal(agg.get("idle_cost", "0")))),
        "mean_utilization": None if util is None else str(util.quantize(UTIL_PLACES, ROUND_HALF_UP)),
        "unknown_utilization_gpu_hours": str(_hours(seconds - known)),
        "idle_cost_complete": known == seconds,
    }


def _sum_aggs(aggs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for agg in aggs:
        total = _agg_add(total, agg)
    return total


def report_teams_for(*, user: Any, team_slug: str | None = None) -> tuple[list[Team], bool]:
    """Teams whose report the user may read, and whether they see the whole fleet (admins without a team
    filter). Admins: every team; managers: the teams they manage. A team the user cannot see is 404; a team they
    are only a member of, or no managed team at all, is 403."""
    if not getattr(user, "is_authenticated", False):
        raise Forbidden("Sign in to read reports.", code="unauthenticated", status=401)
    if team_slug:
        team = Team.objects.visible_to(user).filter(slug=team_slug).first()
        if team is None:
            raise NotFound(f"No team {team_slug!r} that you belong to.")
        if not user.is_staff and team.pk not in managed_team_ids_of(user):
            raise Forbidden("Monthly reports are for the team's managers and administrators.")
        return [team], False
    if user.is_staff:
        return list(Team.objects.order_by("slug")), True
    managed = list(Team.objects.filter(pk__in=managed_team_ids_of(user)).order_by("slug"))
    if not managed:
        raise Forbidden("Monthly reports are for team managers and administrators.")
    return managed, False


def monthly_figures(*, month: date) -> tuple[dict[str, Any], MonthClose | None]:
    """The frozen figures of a closed month, else the ledger's current figures."""
    closing = month_close_of(month)
    if closing is not None and closing.status == MonthStatus.CLOSED:
        return closing.figures, closing
    return report_figures(month=month), closing


def monthly_report(
    *, user: Any, month: date, team_slug: str | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The monthly report (GET /api/v1/reports/monthly/): per team GPU-hours, cost, idle cost, mean utilization,
    by GPU model and by user; totals over the teams shown. Amounts rounded to the cent here, and only here."""
    teams, whole_fleet = report_teams_for(user=user, team_slug=team_slug)
    figures, closing = monthly_figures(month=month)
    allowed = {t.slug for t in teams}
    names = {t.slug: t.name for t in teams}
    team_rows = []
    shown: dict[str, dict[str, Any]] = {}
    for slug in sorted(allowed):
        data = figures["teams"].get(slug)
        if data is None and (whole_fleet or not team_slug):
            continue  # teams without usage are left out of fleet and multi-team reports
        data = data or {"name": names[slug], "by_gpu_model": {}, "by_user": {}}
        shown[slug] = data
        team_total = _sum_aggs(data["by_gpu_model"].values())
        team_rows.append(
            {
                "team": slug,
                "name": data.get("name", names[slug]),
                **_present(team_total),
                "by_gpu_model": [
                    {"gpu_model": name, **_present(agg)} for name, agg in sorted(data["by_gpu_model"].items())
                ],
                "by_user": [{"user": name, **_present(agg)} for name, agg in sorted(data["by_user"].items())],
            }
        )
    model_totals: dict[str, dict[str, Any]] = {}
    for data in shown.values():
        for name, agg in data["by_gpu_model"].items():
            model_totals[name] = _agg_add(model_totals.get(name, {}), agg)
    grand = _sum_aggs(model_totals.values())
    status = "open" if closing is None else closing.status
    return {
        "month": month_label(month),
        "currency": settings.PORTAL_CURRENCY,
        "status": status,
        "closed_at": closing.closed_at.isoformat() if closing is not None and status == MonthStatus.CLOSED else None,
        "generated_at": (now or timezone.now()).isoformat(),
        "scope": "fleet" if whole_fleet else "teams",
        "teams": team_rows,
        "totals": {
            **_present(grand),
            "by_gpu_model": [{"gpu_model": name, **_present(agg)} for name, agg in sorted(model_totals.items())],
        },
    }


CSV_COLUMNS = [
    "month",
    "team",
    "section",
    "key",
    "gpu_hours",
    "cost",
    "idle_cost",
    "mean_utilization",
    "unknown_utilization_gpu_hours",
    "idle_cost_complete",
    "currency",
]
CSV_ALL_TEAMS = "*"


def report_csv_rows(report: dict[str, Any]) -> list[list[str]]:
    """The report as flat rows (header first): one row per team, per team and GPU model, per team and user, and
    the totals (team `*`). Same figures as the JSON, in the same rounding."""

    def line(team: str, section: str, key: str, fig: dict[str, Any]) -> list[str]:
        util = fig["mean_utilization"]
        return [
            report["month"],
            team,
            section,
            key,
            fig["gpu_hours"],
            fig["cost"],
            fig["idle_cost"],
            "" if util is None else util,
            fig["unknown_utilization_gpu_hours"],
            "true" if fig["idle_cost_complete"] else "false",
            report["currency"],
        ]

    rows = [CSV_COLUMNS]
    for team in report["teams"]:
        rows.append(line(team["team"], "team", "", team))
        rows += [line(team["team"], "gpu_model", m["gpu_model"], m) for m in team["by_gpu_model"]]
        rows += [line(team["team"], "user", u["user"], u) for u in team["by_user"]]
    rows.append(line(CSV_ALL_TEAMS, "total", "", report["totals"]))
    rows += [line(CSV_ALL_TEAMS, "gpu_model", m["gpu_model"], m) for m in report["totals"]["by_gpu_model"]]
    return rows


# --- Chart data for the Costs pages ----------------------------------------------------------------------------------


def daily_costs(*, month: date, team_ids: Sequence[int], now: datetime | None = None) -> dict[str, Any]:
    """Cost per day of the month per team (ledger, plus live pieces for the current month)."""
    usage = teams_month_usage(team_ids=team_ids, month=month, now=now, by_day=True)
    days = costing.days_of_month(month)
    teams = dict(Team.objects.filter(pk__in=list(team_ids)).values_list("pk", "slug"))
    series = []
    for tid in sorted(team_ids, key=lambda t: teams.get(t, "")):
        by_day = usage[tid].by_day
        if not by_day:
            continue
        series.append({"team": teams[tid], "values": [str(costing.to_cents(by_day.get(d, ZERO))) for d in days]})
    return {"days": [d.isoformat() for d in days], "series": series}


def utilization_heatmap(*, month: date, team_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Mean utilization of each GPU on each day of the month while allocated (ledger rows with telemetry):
    rows are GPUs, columns days; a cell is null where the GPU was not allocated or reported nothing."""
    qs = UsageRecord.objects.filter(month=month, mean_utilization__isnull=False).order_by()
    if team_ids is not None:
        qs = qs.filter(team_id__in=list(team_ids))
    money = DecimalField(max_digits=30, decimal_places=10)
    cells = qs.values("gpu_id", "day").annotate(
        seconds=Sum("gpu_seconds"), util=Sum(F("gpu_seconds") * F("mean_utilization"), output_field=money)
    )
    days = costing.days_of_month(month)
    index = {d: i for i, d in enumerate(days)}
    grid: dict[int, list[float | None]] = {}
    for cell in cells:
        row = grid.setdefault(cell["gpu_id"], [None] * len(days))
        if cell["seconds"]:
            row[index[cell["day"]]] = round(float(Decimal(cell["util"]) / Decimal(cell["seconds"])), 4)
    gpus = {
        g.pk: g for g in Gpu.objects.filter(pk__in=list(grid)).select_related("node", "model").order_by("node__name")
    }
    ordered = sorted(grid, key=lambda pk: (gpus[pk].node.name, gpus[pk].index))
    return {
        "days": [d.isoformat() for d in days],
        "gpus": [f"{gpus[pk].node.name}/{gpus[pk].index} {gpus[pk].model.name}" for pk in ordered],
        "values": [grid[pk] for pk in ordered],
    }


def month_comparison(*, month: date, report: dict[str, Any], user: Any) -> list[dict[str, Any]]:
    """Each team of `report` against the previous month: cost and GPU-hours, and the change."""
    previous = costing.previous_month(month)
    try:
        before = monthly_report(user=user, month=previous)
    except Forbidden:
        return []
    prev = {t["team"]: t for t in before["teams"]}
    rows = []
    for team in report["teams"]:
        last = prev.get(team["team"])
        last_cost = Decimal(last["cost"]) if last else ZERO
        cost = Decimal(team["cost"])
        change = None if not last_cost else str(((cost - last_cost) / last_cost * 100).quantize(Decimal("0.1")))
        rows.append(
            {
                "team": team["team"],
                "cost": team["cost"],
                "previous_cost": str(costing.to_cents(last_cost)),
                "gpu_hours": team["gpu_hours"],
                "previous_gpu_hours": last["gpu_hours"] if last else "0.000",
                "change_percent": change,
            }
        )
    return rows


def burn_down(*, team: Team, now: datetime | None = None) -> dict[str, Any]:
    """The team's cumulative cost over the current month against its budget, with a projection to month end."""
    now = now or timezone.now()
    tz = local_tz()
    month = current_month(now=now)
    first, after = costing.month_bounds(month, tz)
    usage = teams_month_usage(team_ids=[team.pk], month=month, now=now, by_day=True)[team.pk]
    days = costing.days_of_month(month)
    today = now.astimezone(tz).date()
    cumulative: list[str | None] = []
    running = ZERO
    for d in days:
        running += usage.by_day.get(d, ZERO)
        cumulative.append(str(costing.to_cents(running)) if d <= today else None)
    projected_end = costing.project_month_end(
        spent=usage.cost, month_start=first, month_end=after, now=now, running_hourly=usage.running_hourly
    )
    # The projection: a straight line from today's cumulative cost to the projected month-end cost.
    projection: list[str | None] = []
    remaining_days = [d for d in days if d >= today]
    span = max(len(remaining_days) - 1, 1)
    for d in days:
        if d < today:
            projection.append(None)
        else:
            k = Decimal(remaining_days.index(d)) / span
            projection.append(str(costing.to_cents(usage.cost + (projected_end - usage.cost) * k)))
    budget = team_budget(team_id=team.pk, month=month)
    return {
        "month": month_label(month),
        "days": [d.isoformat() for d in days],
        "cumulative": cumulative,
        "projection": projection,
        "projected_month_cost": str(costing.to_cents(projected_end)),
        "budget_soft": None if budget.soft is None else str(budget.soft),
        "budget_hard": None if budget.hard is None else str(budget.hard),
        "currency": settings.PORTAL_CURRENCY,
    }


# --- Notifications --------------------------------------------------------------------------------------------------


def notifications_for(*, user: Any, team: Team | None = None, limit: int = 10) -> list[Notification]:
    """Recent notifications of the user's teams (admins: all teams), newest first."""
    qs = Notification.objects.visible_to(user).select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    return list(qs[:limit])


def team_page_visible(*, user: Any, slug: str) -> Team:
    """The team, if the user may see its cost page (members, managers, admins); 404 otherwise."""
    team = Team.objects.visible_to(user).filter(slug=slug).first()
    if team is None:
        raise NotFound("No such team.")
    return team


def is_manager_of(*, user: Any, team: Team) -> bool:
    if getattr(user, "is_staff", False):
        return True
    return team.memberships.filter(user=user, role=Role.MANAGER).exists()


def teams_of_user(*, user: Any) -> list[Team]:
    return list(Team.objects.filter(pk__in=team_ids_of(user)).order_by("slug"))
