"""The efficiency report (GET /api/v1/reports/efficiency/, the Efficiency page, a section of the monthly PDF): per
team and per user for one month, from the billing ledger (allocated GPU-hours and their mean utilization) and the
idle detector's record (reclaimed GPU-hours).

- `allocated_gpu_hours`: every ledger row of the month;
- `used_gpu_hours`: the rows' GPU-hours weighted by their mean utilization (rows with telemetry);
- `idle_gpu_hours`, `idle_cost`: the rest of the rows with telemetry (as billing's idle cost: cost x (1 - mean
  utilization)); rows without telemetry count in neither;
- `reclaimed_gpu_hours`, `reclaimed_cost`: reservations and jobs reclaimed while idle or released unused that month;
- `memory_peak_pct` (over `jobs_measured` jobs): the mean of each job's GPU memory peak as a share of its GPUs'
  memory (right-sizing: a team at 15% could use smaller GPUs or MIG instances);
- `worst`: the jobs and reservations with the highest idle cost, with their memory peak against the GPUs' memory.
Access as for the monthly report: admins every team, managers their teams, members 403.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import DecimalField, F, FloatField, Max, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce, Greatest, Now, Trunc

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.billing import costing
from apps.billing.models import UsageRecord
from apps.billing.selectors.months import local_tz, month_label
from apps.billing.selectors.reports import report_teams_for
from apps.efficiency.jobinfo import job_efficiency
from apps.efficiency.models import IdleMark, MarkState
from apps.jobs.models import Job
from apps.telemetry.models import GpuHourlyRollup, GpuRollup
from apps.telemetry.selectors import minutes_kept_from

WORST_SHOWN = 10
_H = Decimal(3600)
_CENT = Decimal("0.01")


def _month_bounds(month: date) -> tuple[datetime, datetime]:
    tz = local_tz()
    nxt = (month.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime.combine(month, time(), tz), datetime.combine(nxt, time(), tz)


def _figures(
    seconds: Any, used: Any, known: Any, idle_cost: Any, reclaimed: Decimal, reclaimed_cost: Decimal
) -> dict[str, str]:
    seconds_d = Decimal(seconds or 0)
    used_d = Decimal(str(used or 0))
    known_d = Decimal(known or 0)
    return {
        "allocated_gpu_hours": str((seconds_d / _H).quantize(_CENT)),
        "used_gpu_hours": str((used_d / _H).quantize(_CENT)),
        "idle_gpu_hours": str(((known_d - used_d) / _H).quantize(_CENT)),
        "idle_cost": str(costing.to_cents(Decimal(idle_cost or 0))),
        "unknown_utilization_gpu_hours": str(((seconds_d - known_d) / _H).quantize(_CENT)),
        "reclaimed_gpu_hours": str(reclaimed.quantize(_CENT)),
        "reclaimed_cost": str(costing.to_cents(reclaimed_cost)),
    }


def _annotations() -> dict[str, Any]:
    known = Q(mean_utilization__isnull=False)
    money = DecimalField(max_digits=24, decimal_places=8)
    return {
        "seconds": Sum("gpu_seconds"),
        "used": Sum(F("gpu_seconds") * F("mean_utilization"), filter=known, output_field=FloatField()),
        "known": Sum("gpu_seconds", filter=known),
        "idle": Sum(F("cost") - F("cost") * F("mean_utilization"), filter=known, output_field=money),
    }


def _memory_shares(month: date, team_ids: list[int]) -> dict[tuple[int, int | None], list[float]]:
    """{(team, user): [peak memory / memory given, per job that ran in the month with telemetry]}. A job on whole
    GPUs: its GPUs' minute rows inside its own run (the GPU is the job's alone; for hours whose minutes are pruned,
    the hourly rows), against the GPU's memory. A job on a MIG instance or share: the peak its node attributed to its
    own processes (`Job.gpu_memory_own_peak_mib`; the GPU's rows are its neighbours' too), against the memory its
    parts give it. One query, from the jobs' GPU links: each link reads only its own job's window (joining the jobs
    from the rollups would let one job's rows stand for every job that ever ran on that GPU)."""
    start, end = _month_bounds(month)
    link = Job.gpus.through
    peak = (
        GpuRollup.objects.filter(
            gpu_id=OuterRef("gpu_id"),
            minute__gte=OuterRef("run_from"),
            minute__lte=OuterRef("run_to"),
        )
        .order_by()
        .values("gpu_id")
        .annotate(m=Max("mem_used_max"))
        .values("m")
    )
    # The hours whose minutes the prune has deleted (a past month's first weeks): their hourly peaks
    # (`telemetry.selectors.gpu_readings` reads a job's page the same way).
    hourly_peak = (
        GpuHourlyRollup.objects.filter(
            gpu_id=OuterRef("gpu_id"),
            hour__gte=OuterRef("run_from_hour"),
            hour__lte=OuterRef("run_to"),
            hour__lt=minutes_kept_from(),
        )
        .order_by()
        .values("gpu_id")
        .annotate(m=Max("mem_used_max"))
        .values("m")
    )
    links_of_month = (
        link.objects.filter(job__team_id__in=team_ids, job__started_at__lt=end)
        .filter(Q(job__ended_at__gte=start) | Q(job__ended_at__isnull=True))
        .annotate(
            run_from=Trunc("job__started_at", "minute"),
            run_from_hour=Trunc("job__started_at", "hour", tzinfo=UTC),  # hourly rows are UTC hours
            run_to=Coalesce("job__ended_at", Now()),
        )
        .annotate(peak=Greatest(Subquery(peak), Subquery(hourly_peak)))  # PostgreSQL's GREATEST skips NULLs
    )
    columns = ("job_id", "job__team_id", "job__user_id", "gpu__memory_mib", "gpu__parent_id")
    rows: Any = links_of_month.values_list(*columns, "job__gpu_memory_own_peak_mib", "peak")
    jobs: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        jobs[row[0]].append(row)
    out: dict[tuple[int, int | None], list[float]] = defaultdict(list)
    for links in jobs.values():
        _, team_id, user_id, _, _, own_peak, _ = links[0]
        if any(parent is not None for _, _, _, _, parent, _, _ in links):
            given: dict[int, int] = defaultdict(int)  # half of a GPU split in four: two shares' memory together
            for _, _, _, memory, parent, _, _ in links:
                given[parent or 0] += memory
            used, total = own_peak, max(given.values())
        else:
            peaks = [p for *_, p in links if p is not None]
            used, total = (max(peaks) if peaks else None), max(memory for _, _, _, memory, *_ in links)
        if used is not None and total:
            out[(team_id, user_id)].append(min(1.0, used / total))
    return out


def _memory_figures(shares: list[float]) -> dict[str, Any]:
    return {
        "jobs_measured": len(shares),
        "memory_peak_pct": str(round(100 * sum(shares) / len(shares), 1)) if shares else None,
    }


def efficiency_figures(*, month: date, team_ids: list[int]) -> dict[int, dict[str, Any]]:
    """{team_id: {"team": figures, "users": {user_id: figures}, "worst": [...]}} (no access check: callers do)."""
    rows: Any = UsageRecord.objects.filter(month=month, team_id__in=team_ids)  # annotated by name below
    start, end = _month_bounds(month)
    marks = IdleMark.objects.filter(
        team_id__in=team_ids,
        state__in=[MarkState.RECLAIMED, MarkState.UNUSED],
        reclaimed_at__gte=start,
        reclaimed_at__lt=end,
    )
    zero = (Decimal(0), Decimal(0))
    rec_team: dict[int, tuple[Decimal, Decimal]] = defaultdict(lambda: zero)
    rec_user: dict[tuple[int, int | None], tuple[Decimal, Decimal]] = defaultdict(lambda: zero)
    for team_id, user_id, hours, cost in marks.values_list(
        "team_id", "user_id", "reclaimed_gpu_hours", "reclaimed_cost"
    ):
        h, c = rec_team[team_id]
        rec_team[team_id] = (h + hours, c + cost)
        h, c = rec_user[(team_id, user_id)]
        rec_user[(team_id, user_id)] = (h + hours, c + cost)
    out: dict[int, dict[str, Any]] = {}
    for r in rows.values("team_id").annotate(**_annotations()):
        raw = (r["seconds"], r["used"], r["known"], r["idle"], *rec_team[r["team_id"]])
        out[r["team_id"]] = {"team": _figures(*raw), "raw": raw, "users": {}, "worst": []}
    for team_id in team_ids:
        raw = (0, 0, 0, 0, *rec_team[team_id])
        out.setdefault(team_id, {"team": _figures(*raw), "raw": raw, "users": {}, "worst": []})
    for r in rows.values("team_id", "user_id").annotate(**_annotations()):
        out[r["team_id"]]["users"][r["user_id"]] = _figures(
            r["seconds"], r["used"], r["known"], r["idle"], *rec_user[(r["team_id"], r["user_id"])]
        )
    for (tid, uid), rec in rec_user.items():
        out[tid]["users"].setdefault(uid, _figures(0, 0, 0, 0, *rec))
    shares = _memory_shares(month, team_ids)
    for team_id, f in out.items():
        f["team"].update(_memory_figures([x for (t, _), v in shares.items() if t == team_id for x in v]))
        for uid in list(f["users"]):
            f["users"][uid].update(_memory_figures(shares.get((team_id, uid), [])))
    worst: Any = (
        rows.values("team_id", "user_id", "source", "source_id")
        .annotate(**_annotations())
        .annotate(idle_sort=Coalesce("idle", Decimal(0), output_field=DecimalField()))
        .order_by("-idle_sort", "source", "source_id")
    )
    per_team_count: dict[int, int] = defaultdict(int)
    for r in worst[: WORST_SHOWN * max(len(team_ids), 1)]:
        if per_team_count[r["team_id"]] >= WORST_SHOWN or not r["idle"]:
            continue
        per_team_count[r["team_id"]] += 1
        fig = _figures(r["seconds"], r["used"], r["known"], r["idle"], Decimal(0), Decimal(0))
        item: dict[str, Any] = {
            "kind": r["source"],
            "id": r["source_id"],
            "user_id": r["user_id"],
            "allocated_gpu_hours": fig["allocated_gpu_hours"],
            "idle_gpu_hours": fig["idle_gpu_hours"],
            "idle_cost": fig["idle_cost"],
            "memory_peak_mib": None,
            "memory_allocated_mib": None,
        }
        if r["source"] == "job":
            job = Job.objects.filter(pk=r["source_id"]).first()
            if job is not None:
                eff = job_efficiency(job, advice_too=False)  # its figures only: no log to read per row
                item["memory_peak_mib"] = eff.gpu_memory_peak_mib
                item["memory_allocated_mib"] = eff.gpu_memory_total_mib or None
        out[r["team_id"]]["worst"].append(item)
    return out


def efficiency_report(*, user: AnyUser, month: date, team_slug: str | None = None) -> dict[str, Any]:
    """The report for the teams the user may read (403/404 as the monthly report)."""
    teams, _ = report_teams_for(user=user, team_slug=team_slug)
    figures = efficiency_figures(month=month, team_ids=[t.pk for t in teams])
    user_ids = {u for f in figures.values() for u in f["users"]} | {
        w["user_id"] for f in figures.values() for w in f["worst"]
    }
    names = dict(get_user_model().objects.filter(pk__in=[u for u in user_ids if u]).values_list("pk", "username"))
    out_teams = []
    for team in teams:
        f = figures[team.pk]
        out_teams.append(
            {
                "team": team.slug,
                "name": team.name,
                **f["team"],
                "by_user": sorted(
                    (
                        {"user": names.get(uid, "(deleted)") if uid else "(none)", **fig}
                        for uid, fig in f["users"].items()
                    ),
                    key=lambda u: (-Decimal(u["idle_cost"]), u["user"]),
                ),
                "worst": [
                    {**{k: v for k, v in w.items() if k != "user_id"}, "user": names.get(w["user_id"], "")}
                    for w in f["worst"]
                ],
            }
        )
    # Totals from the teams' unrounded sums, as the monthly report's: the sum of rounded figures can be a cent off
    # the same month's idle cost on the Costs page.
    raws = [figures[t.pk]["raw"] for t in teams]
    totals = _figures(*(sum((Decimal(str(r[i] or 0)) for r in raws), Decimal(0)) for i in range(6)))
    return {"month": month_label(month), "currency": settings.PORTAL_CURRENCY, "teams": out_teams, "totals": totals}


CSV_COLUMNS = [
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "idle_cost",
    "reclaimed_gpu_hours",
    "reclaimed_cost",
]


def report_csv_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per team, per team and user, the worst items, and the totals."""
    head = ["month", "scope", "team", "user", "item", *CSV_COLUMNS]
    rows: list[list[str]] = [[*head, "memory_peak_mib", "memory_allocated_mib", "memory_peak_pct"]]
    m = report["month"]
    for t in report["teams"]:
        rows.append([m, "team", t["team"], "", "", *[t[c] for c in CSV_COLUMNS], "", "", t["memory_peak_pct"] or ""])
        for u in t["by_user"]:
            rows.append(
                [m, "user", t["team"], u["user"], "", *[u[c] for c in CSV_COLUMNS], "", "", u["memory_peak_pct"] or ""]
            )
        for w in t["worst"]:
            rows.append(
                [
                    m, "worst", t["team"], w["user"], f"{w['kind']}:{w['id']}", w["allocated_gpu_hours"], "",
                    w["idle_gpu_hours"], w["idle_cost"], "", "", str(w["memory_peak_mib"] or ""),
                    str(w["memory_allocated_mib"] or ""), "",
                ]
            )  # fmt: skip
    rows.append([m, "total", "", "", "", *[report["totals"][c] for c in CSV_COLUMNS], "", "", ""])
    return rows


def pdf_lines(*, team_slug: str, month: date) -> list[str]:
    """The monthly PDF's efficiency section for one team, as plain sentences (apps/billing/pdf.py lays them out)."""
    team = Team.objects.filter(slug=team_slug).first()
    if team is None:
        return []
    f = efficiency_figures(month=month, team_ids=[team.pk])[team.pk]
    fig = f["team"]
    cur = settings.PORTAL_CURRENCY
    lines = [
        f"{fig['allocated_gpu_hours']} GPU-hours allocated, {fig['used_gpu_hours']} used (weighted by utilization), "
        f"{fig['idle_gpu_hours']} idle costing {fig['idle_cost']} {cur}.",
        f"Reclaimed while idle or unused: {fig['reclaimed_gpu_hours']} GPU-hours ({fig['reclaimed_cost']} {cur}).",
    ]
    for w in f["worst"][:3]:
        mem = (
            f", memory peak {w['memory_peak_mib']} of {w['memory_allocated_mib']} MiB"
            if w["memory_peak_mib"] is not None
            else ""
        )
        lines.append(
            f"Most idle: {w['kind']} #{w['id']}: {w['idle_gpu_hours']} idle GPU-hours, {w['idle_cost']} {cur}{mem}."
        )
    return lines
