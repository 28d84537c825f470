"""Reads for the home page: a summary each app contributes to (fleet, bookings, jobs, cost)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.accounts.selectors import memberships_of, teams_of
from apps.accounts.types import AnyUser

HOME_ROWS = 5  # jobs and reservations listed on the home page; the Jobs and Book pages list the rest


def home_summary(*, user: AnyUser, now: datetime | None = None) -> dict[str, Any]:
    """What a researcher looks for first: the fleet's state, their own jobs that are not finished, their next
    reservations, and what each of their teams has spent this month (with the daily figures for a small chart)."""
    from apps.billing.selectors import current_month, daily_costs, usage_summary
    from apps.booking.selectors import reservations_current_and_upcoming
    from apps.fleet.selectors import fleet_summary
    from apps.jobs.models import ACTIVE_STATES
    from apps.jobs.selectors import jobs_visible_to

    now = now or timezone.now()
    my_teams = [m.team for m in memberships_of(user=user)]
    jobs = jobs_visible_to(user=user).filter(user_id=user.pk or 0, state__in=ACTIVE_STATES)
    reservations = [r for r in reservations_current_and_upcoming(user=user, now=now, limit=50) if r.user_id == user.pk][
        :HOME_ROWS
    ]
    daily = daily_costs(month=current_month(now=now), team_ids=[t.pk for t in my_teams], now=now)
    today = timezone.localtime(now).date().isoformat()
    # Up to today: the rest of the month has no spend yet and would only squeeze the bars.
    shown = sum(1 for d in daily["days"] if d <= today)
    chart = {
        "days": daily["days"][:shown],
        "series": [{"team": s["team"], "values": s["values"][:shown]} for s in daily["series"]],
    }
    return {
        "teams": list(teams_of(user=user)),
        "fleet": fleet_summary(user=user),
        "jobs": list(jobs[:HOME_ROWS]),
        "jobs_more": jobs.count() > HOME_ROWS,
        "reservations": reservations,
        "now": now,
        "spend": [{"team": t, "usage": usage_summary(team=t, now=now)} for t in my_teams],
        "spend_chart": chart,
    }
