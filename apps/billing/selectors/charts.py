"""Chart data for the Costs pages: daily costs, the utilization heatmap, month against month, the burn-down."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import DecimalField, F, Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.billing import costing
from apps.billing.models import UsageRecord
from apps.billing.selectors.months import ZERO, current_month, local_tz, month_label
from apps.billing.selectors.reports import monthly_report
from apps.billing.selectors.usage import rounded_hours, team_budget, teams_month_usage
from apps.core.errors import Forbidden
from apps.fleet.models import Gpu


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
    rows are physical GPUs, columns days; a cell is null where the GPU was not allocated or reported nothing. The
    rows of a GPU's MIG instances and shares count in their GPU's cell, weighted by their GPU-seconds (a 1g
    instance's hour weighs 1/7 of a whole GPU's)."""
    qs = UsageRecord.objects.filter(month=month, mean_utilization__isnull=False).order_by()
    if team_ids is not None:
        qs = qs.filter(team_id__in=list(team_ids))
    money = DecimalField(max_digits=30, decimal_places=10)
    cells = qs.values("gpu_id", "gpu__parent_id", "day").annotate(
        seconds=Sum("gpu_seconds"), util=Sum(F("gpu_seconds") * F("mean_utilization"), output_field=money)
    )
    days = costing.days_of_month(month)
    index = {d: i for i, d in enumerate(days)}
    sums: dict[int, dict[date, tuple[Decimal, Decimal]]] = {}
    for cell in cells:
        by_day = sums.setdefault(cell["gpu__parent_id"] or cell["gpu_id"], {})
        seconds, util = by_day.get(cell["day"], (ZERO, ZERO))
        by_day[cell["day"]] = (seconds + Decimal(cell["seconds"] or 0), util + Decimal(cell["util"] or 0))
    grid: dict[int, list[float | None]] = {}
    for gpu_id, by_day in sums.items():
        row = grid.setdefault(gpu_id, [None] * len(days))
        for day, (seconds, util) in by_day.items():
            if seconds:
                row[index[day]] = round(float(util / seconds), 4)
    gpus = {
        g.pk: g for g in Gpu.objects.filter(pk__in=list(grid)).select_related("node", "model").order_by("node__name")
    }
    ordered = sorted(grid, key=lambda pk: (gpus[pk].node.name, gpus[pk].index))
    return {
        "days": [d.isoformat() for d in days],
        "gpus": [f"{gpus[pk].node.name}/{gpus[pk].index} {gpus[pk].model.name}" for pk in ordered],
        "values": [grid[pk] for pk in ordered],
    }


def month_comparison(
    *, month: date, report: dict[str, Any], user: AnyUser, now: datetime | None = None
) -> dict[str, Any]:
    """Each team of `report` against the previous month: cost and GPU-hours, and the change. A month in progress
    is set against the previous month up to the same point (as far into it as `now` is into this one): a whole
    month against six days reads as a fall that is not there."""
    now = now or timezone.now()
    previous = costing.previous_month(month)
    try:
        before = monthly_report(user=user, month=previous)
    except Forbidden:
        return {"rows": [], "to": None}
    prev = {t["team"]: (Decimal(t["cost"]), str(t["gpu_hours"])) for t in before["teams"]}
    cutoff = None
    if month == current_month(now=now):
        tz = local_tz()
        first = costing.month_bounds(month, tz)[0]
        prev_first, prev_after = costing.month_bounds(previous, tz)
        cutoff = min(prev_first + (now - first), prev_after)
        slugs = [t["team"] for t in report["teams"]]
        prev = _ledger_up_to(month=previous, cutoff=cutoff, team_slugs=slugs)
    rows = []
    for team in report["teams"]:
        last_cost, last_hours = prev.get(team["team"], (ZERO, "0.000"))
        cost = Decimal(team["cost"])
        change = None if not last_cost else format(((cost - last_cost) / last_cost * 100).quantize(Decimal("0.1")), "+")
        rows.append(
            {
                "team": team["team"],
                "cost": team["cost"],
                "previous_cost": str(costing.to_cents(last_cost)),
                "gpu_hours": team["gpu_hours"],
                "previous_gpu_hours": last_hours,
                "change_percent": change,
            }
        )
    return {"rows": rows, "to": None if cutoff is None else cutoff.astimezone(local_tz())}


def _ledger_up_to(*, month: date, cutoff: datetime, team_slugs: Sequence[str]) -> dict[str, tuple[Decimal, str]]:
    """Cost (to the cent) and GPU-hours per team of `month`'s ledger before `cutoff`; the rows that straddle it
    count for their part before it (a ledger row lies within one day, so there are few)."""
    rows = UsageRecord.objects.filter(month=month, team__slug__in=list(team_slugs), start__lt=cutoff).order_by()
    cost: dict[str, Decimal] = {}
    seconds: dict[str, Decimal] = {}
    for row in rows.filter(end__lte=cutoff).values("team__slug").annotate(c=Sum("cost"), s=Sum("gpu_seconds")):
        cost[row["team__slug"]] = Decimal(row["c"] or 0)
        seconds[row["team__slug"]] = Decimal(row["s"] or 0)
    for slug, start, end, row_cost, row_seconds in rows.filter(end__gt=cutoff).values_list(
        "team__slug", "start", "end", "cost", "gpu_seconds"
    ):
        part = Decimal((cutoff - start).total_seconds()) / Decimal((end - start).total_seconds())
        cost[slug] = cost.get(slug, ZERO) + row_cost * part
        seconds[slug] = seconds.get(slug, ZERO) + row_seconds * part
    return {slug: (costing.to_cents(cost[slug]), str(rounded_hours(int(seconds[slug])))) for slug in cost}


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
