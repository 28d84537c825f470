"""The Efficiency page (managers and admins): a month's allocated, used and idle GPU-hours per team and user, with
charts, the CSV, and the jobs and reservations that wasted most."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.billing import costing
from apps.billing.selectors.months import current_month, month_label, parse_month
from apps.core.errors import ApplicationError
from apps.efficiency import report


@login_required
def index(request: HttpRequest) -> HttpResponse:
    team = request.GET.get("team") or None
    try:
        month = parse_month(request.GET.get("month"))
        body = report.efficiency_report(user=request.user, month=month, team_slug=team)
    except ApplicationError as exc:
        # Members and bad input get the page with the reason, not an error page.
        return render(request, "efficiency/index.html", {"error": str(exc), "nav_section": "efficiency"}, status=200)
    charts = {
        "teams": [
            {
                "team": t["team"],
                "used": t["used_gpu_hours"],
                "idle": t["idle_gpu_hours"],
                "reclaimed": t["reclaimed_gpu_hours"],
            }
            for t in body["teams"]
        ],
        "users": [
            {"label": f"{t['team']}/{u['user']}", "idle_cost": u["idle_cost"]}
            for t in body["teams"]
            for u in t["by_user"]
        ][:20],
    }
    query = f"month={body['month']}" + (f"&team={team}" if team else "")
    return render(
        request,
        "efficiency/index.html",
        {
            "nav_section": "efficiency",
            "report": body,
            "charts": charts,
            "csv_url": f"/api/v1/reports/efficiency/?{query}&format=csv",
            "previous_month": month_label(costing.previous_month(month)),
            "next_month": month_label(costing.next_month(month)) if month < current_month() else None,
        },
    )
