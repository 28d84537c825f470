"""Costs pages: the monthly report with charts (admins: the fleet; managers: their teams), a team's live cost
page (members too), and the printable PDF statements."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils import timezone

from apps.accounts.models import Team
from apps.billing import costing, pdf, selectors
from apps.core.errors import ApplicationError, Forbidden, NotFound


def _page_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Application errors on pages: 404 and 403 pages, 400 for bad input."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.detail) from exc
        except Forbidden as exc:
            raise PermissionDenied(exc.detail) from exc
        except ApplicationError as exc:
            return HttpResponseBadRequest(exc.detail)

    return wrapped


def _charts(report: dict[str, Any], month: Any, team_ids: list[int] | None) -> dict[str, Any]:
    """What the report page draws: cost by team stacked by GPU model, daily cost, idle cost by team, and the
    utilization heatmap (GPUs x days)."""
    models = sorted({m["gpu_model"] for t in report["teams"] for m in t["by_gpu_model"]})
    by_team_model = {
        "teams": [t["team"] for t in report["teams"]],
        "series": [
            {
                "gpu_model": name,
                "values": [
                    next((m["cost"] for m in t["by_gpu_model"] if m["gpu_model"] == name), "0") for t in report["teams"]
                ],
            }
            for name in models
        ],
    }
    idle = {
        "teams": [t["team"] for t in report["teams"]],
        "idle": [t["idle_cost"] for t in report["teams"]],
        "busy": [str(Decimal(t["cost"]) - Decimal(t["idle_cost"])) for t in report["teams"]],
    }
    shown_ids = (
        team_ids
        if team_ids is not None
        else list(Team.objects.filter(slug__in=[t["team"] for t in report["teams"]]).values_list("pk", flat=True))
    )
    return {
        "currency": report["currency"],
        "cost_by_team_model": by_team_model,
        "daily": selectors.daily_costs(month=month, team_ids=shown_ids),
        "idle_by_team": idle,
        "heatmap": selectors.utilization_heatmap(month=month, team_ids=team_ids),
    }


@login_required
@_page_errors
def index(request: HttpRequest) -> HttpResponse:
    month = selectors.parse_month(request.GET.get("month"))
    this_month = selectors.current_month()
    context: dict[str, Any] = {
        "nav_section": "billing",
        "month": selectors.month_label(month),
        "previous_month": selectors.month_label(costing.previous_month(month)),
        "next_month": selectors.month_label(costing.next_month(month)) if month < this_month else None,
        "my_teams": [
            {"team": t, "usage": selectors.usage_summary(team=t)} for t in selectors.teams_of_user(user=request.user)
        ],
        "notifications": selectors.notifications_for(user=request.user),
        "currency": settings.PORTAL_CURRENCY,
    }
    try:
        teams, whole_fleet = selectors.report_teams_for(user=request.user)
    except Forbidden:
        return render(request, "billing/index.html", {**context, "report": None})
    report = selectors.monthly_report(user=request.user, month=month)
    team_ids = None if whole_fleet else [t.pk for t in teams]
    context.update(
        {
            "report": report,
            "whole_fleet": whole_fleet,
            "comparison": selectors.month_comparison(month=month, report=report, user=request.user),
            "charts": _charts(report, month, team_ids),
            "csv_url": f"/api/v1/reports/monthly/?month={report['month']}&format=csv",
            "pdf_url": f"/costs/report/{report['month']}.pdf",
        }
    )
    return render(request, "billing/index.html", context)


@login_required
@_page_errors
def team_page(request: HttpRequest, slug: str) -> HttpResponse:
    team = selectors.team_page_visible(user=request.user, slug=slug)
    from apps.booking.selectors import quota_summary

    now = timezone.now()
    usage = selectors.usage_summary(team=team, now=now)
    quota = quota_summary(team=team)
    return render(
        request,
        "billing/team.html",
        {
            "nav_section": "billing",
            "team": team,
            "usage": usage,
            "burn_down": selectors.burn_down(team=team, now=now),
            "quota": quota,
            "quota_rows": _quota_rows(quota, usage),
            "notifications": selectors.notifications_for(user=request.user, team=team),
            "is_manager": selectors.is_manager_of(user=request.user, team=team),
            "month": selectors.month_label(selectors.current_month(now=now)),
        },
    )


def _quota_rows(quota: dict[str, Any], usage: dict[str, Any]) -> list[dict[str, Any]]:
    """The team's limits against what it spent (the ledger, live) and what it booked (booking's holds): what is
    left is measured from the larger of the two. Amounts stay numbers; the template formats them (`money` for the
    budgets, `quantity` for GPU-hours)."""

    def row(label: str, limit: str | None, spent: str, booked: str, *, is_money: bool) -> dict[str, Any]:
        used = max(Decimal(spent), Decimal(booked))
        return {
            "label": label,
            "is_money": is_money,
            "limit": None if limit is None else Decimal(limit),
            "spent": Decimal(spent),
            "booked": Decimal(booked),
            "left": None if limit is None else Decimal(limit) - used,
        }

    limits, booked = quota["limits"], quota["booked"]
    return [
        row("GPU-hours", limits["gpu_hours"], usage["gpu_hours"], booked["gpu_hours"], is_money=False),
        row("Budget (soft)", limits["budget_soft"], usage["cost"], booked["cost"], is_money=True),
        row(
            "Budget (hard: new bookings and jobs refused above)",
            limits["budget_hard"],
            usage["cost"],
            booked["cost"],
            is_money=True,
        ),
    ]


def _pdf_response(content: bytes, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type="application/pdf")
    # attachment: the link saves the statement under its own name rather than opening an unnamed tab
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@_page_errors
def fleet_pdf(request: HttpRequest, month: str) -> HttpResponse:
    """The report of every team the user may read (admins: the fleet): a summary page, then a page per team."""
    report = selectors.monthly_report(user=request.user, month=selectors.parse_month(month))
    return _pdf_response(pdf.fleet_statement(report), f"gpu-report-{report['month']}.pdf")


@login_required
@_page_errors
def team_pdf(request: HttpRequest, month: str, slug: str) -> HttpResponse:
    """One team's invoice-style statement (its managers and admins)."""
    report = selectors.monthly_report(user=request.user, month=selectors.parse_month(month), team_slug=slug)
    return _pdf_response(pdf.team_statement(report, slug), f"gpu-statement-{slug}-{report['month']}.pdf")
