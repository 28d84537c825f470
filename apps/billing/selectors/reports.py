"""Monthly reports: the month's ledger aggregated per team by GPU model, by user and by slice (MIG instances and
shares: what a month close freezes), presented rounded to the cent for the JSON, CSV and PDF reports."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import DecimalField, F, IntegerField, Q, Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import managed_team_ids_of
from apps.accounts.types import AnyUser
from apps.billing import costing
from apps.billing.models import MonthClose, MonthStatus, UsageRecord
from apps.billing.selectors.months import month_close_of, month_label
from apps.billing.selectors.usage import UTIL_PLACES, rounded_hours
from apps.core.errors import Forbidden, NotFound
from apps.fleet.models import GpuModel

_SLUG = re.compile(r"[-a-zA-Z0-9_]+")


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


def slice_name(profile: str, share: Decimal) -> str:
    """How a report names a part of a GPU: its MIG profile, or its share as a fraction ("1/4")."""
    if profile:
        return profile
    parts = round(1 / share) if share > 0 else 0
    return f"1/{parts} share" if parts and abs(Decimal(1) / parts - share) < Decimal("0.000001") else f"{share} share"


def report_figures(*, month: date) -> dict[str, Any]:
    """A month's ledger aggregated in SQL, per team by GPU model, by user and by slice (the rows of MIG instances
    and shares, by model, profile and share), at full precision: what a month close freezes. Three grouped
    queries over the month's rows (index billing_usage_month_team) and three small name look-ups."""
    base = UsageRecord.objects.filter(month=month).order_by()
    ann = _agg_annotations()
    by_model: list[dict[str, Any]] = [dict(r) for r in base.values("team_id", "gpu_model_id").annotate(**ann)]
    by_user: list[dict[str, Any]] = [dict(r) for r in base.values("team_id", "user_id").annotate(**ann)]
    slices = base.filter(share__lt=1).values("team_id", "gpu_model_id", "gpu__mig_profile", "share").annotate(**ann)
    by_slice: list[dict[str, Any]] = [dict(r) for r in slices]
    team_ids = {r["team_id"] for r in by_model}
    teams = {t.pk: t for t in Team.objects.filter(pk__in=team_ids)}
    model_names = dict(GpuModel.objects.filter(pk__in={r["gpu_model_id"] for r in by_model}).values_list("pk", "name"))
    user_ids = {r["user_id"] for r in by_user if r["user_id"] is not None}
    usernames = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))
    out: dict[str, Any] = {}
    for tid in sorted(team_ids, key=lambda t: teams[t].slug):
        out[teams[tid].slug] = {
            "name": teams[tid].name, "team_id": tid, "by_gpu_model": {}, "by_user": {}, "by_slice": {}
        }  # fmt: skip
    for row in by_model:
        out[teams[row["team_id"]].slug]["by_gpu_model"][model_names[row["gpu_model_id"]]] = _agg_from_row(row)
    for row in by_slice:
        model, share = model_names[row["gpu_model_id"]], Decimal(row["share"])
        key = f"{model} {slice_name(row['gpu__mig_profile'], share)}"
        section = out[teams[row["team_id"]].slug]["by_slice"]
        item = {"gpu_model": model, "slice": slice_name(row["gpu__mig_profile"], share), "share": str(share)}
        section[key] = {**item, **_agg_add(section.get(key, {}), _agg_from_row(row))}
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
        "gpu_hours": str(rounded_hours(seconds)),
        "cost": str(costing.to_cents(Decimal(agg.get("cost", "0")))),
        "idle_cost": str(costing.to_cents(Decimal(agg.get("idle_cost", "0")))),
        "mean_utilization": None if util is None else str(util.quantize(UTIL_PLACES, ROUND_HALF_UP)),
        "unknown_utilization_gpu_hours": str(rounded_hours(seconds - known)),
        "idle_cost_complete": known == seconds,
    }


def sum_aggs(aggs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for agg in aggs:
        total = _agg_add(total, agg)
    return total


def report_teams_for(*, user: AnyUser, team_slug: str | None = None) -> tuple[list[Team], bool]:
    """Teams whose report the user may read, and whether they see the whole fleet (admins without a team
    filter). Admins: every team; managers: the teams they manage. A team the user cannot see is 404; a team they
    are only a member of, or no managed team at all, is 403."""
    if not getattr(user, "is_authenticated", False):
        raise Forbidden("Sign in to read reports.", code="unauthenticated", status=401)
    if team_slug:
        # Pages pass the query string through as it came; a slug never holds what PostgreSQL refuses (NUL).
        if not _SLUG.fullmatch(team_slug):
            raise NotFound(f"No team {team_slug!r} that you belong to.")
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
    *, user: AnyUser, month: date, team_slug: str | None = None, now: datetime | None = None
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
        team_total = sum_aggs(data["by_gpu_model"].values())
        team_rows.append(
            {
                "team": slug,
                "name": data.get("name", names[slug]),
                **_present(team_total),
                "by_gpu_model": [
                    {"gpu_model": name, **_present(agg)} for name, agg in sorted(data["by_gpu_model"].items())
                ],
                "by_user": [{"user": name, **_present(agg)} for name, agg in sorted(data["by_user"].items())],
                # A month closed before slices were reported froze no `by_slice`: its slices are in the other lists.
                "by_slice": _slices(data.get("by_slice", {})),
            }
        )
    model_totals: dict[str, dict[str, Any]] = {}
    slice_totals: dict[str, dict[str, Any]] = {}
    for data in shown.values():
        for name, agg in data["by_gpu_model"].items():
            model_totals[name] = _agg_add(model_totals.get(name, {}), agg)
        for name, agg in data.get("by_slice", {}).items():
            slice_totals[name] = {**agg, **_agg_add(slice_totals.get(name, {}), agg)}
    grand = sum_aggs(model_totals.values())
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
            "by_slice": _slices(slice_totals),
        },
    }


def _slices(section: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"gpu_model": agg["gpu_model"], "slice": agg["slice"], "share": agg["share"], **_present(agg)}
        for _, agg in sorted(section.items())
    ]


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
    """The report as flat rows (header first): one row per team, per team and GPU model, per team and user, per
    team and slice (key: model and slice, e.g. `A100-80GB 1g.10gb`), and the totals (team `*`). Same figures as
    the JSON, in the same rounding."""

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
        rows += [line(team["team"], "slice", f"{x['gpu_model']} {x['slice']}", x) for x in team["by_slice"]]
    rows.append(line(CSV_ALL_TEAMS, "total", "", report["totals"]))
    rows += [line(CSV_ALL_TEAMS, "gpu_model", m["gpu_model"], m) for m in report["totals"]["by_gpu_model"]]
    rows += [line(CSV_ALL_TEAMS, "slice", f"{x['gpu_model']} {x['slice']}", x) for x in report["totals"]["by_slice"]]
    return rows
