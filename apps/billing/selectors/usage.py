"""Month-to-date usage of teams, jobs and reservations (ledger rows plus live pieces), budgets, and the ledger
rows a user may list.

Month-to-date figures are live: the ledger's rows of the month plus the pieces of allocations not written yet
(running ones up to now, finished ones still inside BILLING_CLOSE_LAG_S), computed with the same functions the
ledger closer uses, so a live figure equals the rows it becomes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import DecimalField, F, Q, QuerySet, Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.billing import costing
from apps.billing.models import SourceKind, UsageRecord
from apps.billing.selectors.months import ZERO, current_month, local_tz, month_label
from apps.billing.selectors.pricing import price_book
from apps.billing.selectors.unbilled import (
    billable_allocations,
    hourly_cost,
    mig_profile_prices,
    unbilled_allocations,
    unbilled_pieces,
)
from apps.booking.models import AllocationKind

HOURS_PLACES = Decimal("0.001")
UTIL_PLACES = Decimal("0.0001")


@contextlib.contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent view of the ledger and the allocations for the queries inside, so a row the closer writes
    meanwhile is counted once: either as a row or as a live piece, never both or neither. Inside a transaction
    already, that transaction's view is the one there is."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


@dataclass
class MonthUsage:
    """A team's usage in one month: ledger rows plus live pieces (full precision; round only to show)."""

    team_id: int
    month: date
    gpu_seconds: int = 0
    cost: Decimal = ZERO
    live_gpu_seconds: int = 0
    live_cost: Decimal = ZERO
    running_gpus: int = 0  # devices held right now: whole GPUs, MIG instances and shares alike
    running_share: Decimal = ZERO  # the same in physical GPUs (a 1g instance counts 1/7, a quarter share 0.25)
    running_hourly: Decimal = ZERO  # what the devices held right now cost per hour, each slice at its own price
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
                profile_prices = mig_profile_prices() if any(a.profile for a in allocations) else {}
                for alloc in allocations:
                    if alloc.end >= now:  # running this instant
                        usage = out[alloc.team_id]
                        usage.running_gpus += 1
                        usage.running_share += alloc.share
                        usage.running_hourly += hourly_cost(
                            gpu_model_id=alloc.gpu_model_id,
                            profile=alloc.profile,
                            share=alloc.share,
                            gpu_hourly_price=book.price_at(alloc.gpu_model_id, now),
                            profile_prices=profile_prices,
                        )
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


def source_utilization(*, source: str, source_id: int) -> tuple[Decimal | None, Decimal]:
    """(mean utilization 0..1 weighted by GPU-seconds, share 0..1 of the billed GPU-seconds with telemetry) of one
    job's or reservation's ledger rows; (None, 0) before any row or without telemetry. Live pieces have no
    utilization until the closer writes them."""
    money = DecimalField(max_digits=30, decimal_places=10)
    agg = UsageRecord.objects.filter(source=source, source_id=source_id).aggregate(
        seconds=Sum("gpu_seconds"),
        measured=Sum("gpu_seconds", filter=Q(mean_utilization__isnull=False)),
        weighted=Sum(F("gpu_seconds") * F("mean_utilization"), output_field=money),
    )
    seconds, measured = int(agg["seconds"] or 0), int(agg["measured"] or 0)
    if not measured:
        return None, ZERO
    mean = (Decimal(agg["weighted"]) / measured).quantize(UTIL_PLACES)
    return mean, (Decimal(measured) / seconds).quantize(UTIL_PLACES)


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
        "gpu_hours": str(rounded_hours(usage.gpu_seconds)),
        "cost": str(costing.to_cents(usage.cost)),
        "accrued_unbilled_cost": str(costing.to_cents(usage.live_cost)),
        "running_gpus": usage.running_gpus,
        "running_gpu_share": gpu_count_text(usage.running_share),
        "running_hourly_cost": str(costing.to_cents(usage.running_hourly)),
        "projected_month_cost": str(costing.to_cents(projected)),
        "budget_soft": None if budget.soft is None else str(budget.soft),
        "budget_hard": None if budget.hard is None else str(budget.hard),
        "budget_used": None if not reference else str((usage.cost / reference).quantize(UTIL_PLACES)),
        "as_of": now.isoformat(),
    }


def gpu_count_text(gpus: Decimal) -> str:
    """A number of physical GPUs as shown: whole ones plain ("2"), parts to four places ("0.3929")."""
    return f"{gpus.quantize(UTIL_PLACES, ROUND_HALF_UP).normalize():f}"


def rounded_hours(seconds: int | Decimal) -> Decimal:
    return (Decimal(seconds) / costing.SECONDS_PER_HOUR).quantize(HOURS_PLACES, ROUND_HALF_UP)


def usage_records() -> QuerySet[UsageRecord]:
    """Ledger rows newest first, with what a listing shows of them. Callers scope them with `visible_to(user)`
    (admins all, managers their teams', members their own)."""
    return UsageRecord.objects.select_related("team", "user", "gpu", "gpu_model").order_by("-start", "-id")
