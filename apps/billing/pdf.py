"""Printable statements (reportlab): a team's monthly statement, and the fleet's (a summary page, then one page
per team). Input is the presented monthly report (apps.billing.selectors.monthly_report), so the PDF shows the
same rounded figures as the JSON and the CSV."""

from __future__ import annotations

import io
from typing import Any

from django.conf import settings
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import (
    Flowable,
    KeepInFrame,
    PageBreak,
    Paragraph,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)

from apps.billing.selectors.months import parse_month
from apps.efficiency.report import pdf_lines

MAX_USERS_LISTED = 25
_MARGIN = 16 * mm
_FRAME_W = A4[0] - 2 * _MARGIN
_FRAME_H = A4[1] - 2 * _MARGIN - 10 * mm  # room for the footer

_styles = getSampleStyleSheet()
_H1 = _styles["Heading1"]
_H2 = ParagraphStyle("h2", parent=_styles["Heading2"], spaceBefore=8, spaceAfter=4)
_BODY = _styles["BodyText"]
_SMALL = ParagraphStyle("small", parent=_BODY, fontSize=8, textColor=colors.HexColor("#555555"))

_TABLE = TableStyle(
    [
        ("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 9),
        ("FONT", (0, 1), (-1, -1), "Helvetica", 9),
        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eef1f6")),
        ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.HexColor("#9aa3b5")),
        ("LINEBELOW", (0, 1), (-1, -1), 0.25, colors.HexColor("#dde1ea")),
        ("ALIGN", (1, 0), (-1, -1), "RIGHT"),
        ("VALIGN", (0, 0), (-1, -1), "MIDDLE"),
        ("TOPPADDING", (0, 0), (-1, -1), 3),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 3),
    ]
)
_TOTAL_ROW = [("FONT", (0, -1), (-1, -1), "Helvetica-Bold", 9), ("LINEABOVE", (0, -1), (-1, -1), 0.8, colors.black)]


def _pct(value: str | None) -> str:
    return "—" if value is None else f"{float(value) * 100:.1f}%"


def _money(value: str, currency: str) -> str:
    return f"{value} {currency}"


def _figures_table(
    rows: list[dict[str, Any]], key: str, label: str, currency: str, total: dict[str, Any] | None = None
) -> Table:
    header = [label, "GPU-hours", f"Cost ({currency})", f"Idle cost ({currency})", "Mean util."]
    body = [
        [
            str(r[key]),
            r["gpu_hours"],
            r["cost"],
            r["idle_cost"] + ("" if r["idle_cost_complete"] else " *"),
            _pct(r["mean_utilization"]),
        ]
        for r in rows
    ]
    if total is not None:
        body.append(["Total", total["gpu_hours"], total["cost"], total["idle_cost"], _pct(total["mean_utilization"])])
    widths = [_FRAME_W * f for f in (0.34, 0.16, 0.18, 0.18, 0.14)]
    table = Table([header, *body], colWidths=widths, repeatRows=1)
    table.setStyle(_TABLE)
    if total is not None:
        table.setStyle(TableStyle(_TOTAL_ROW))
    return table


def _slices_table(slices: list[dict[str, Any]], currency: str) -> list[Flowable]:
    """The part of the figures held as MIG instances or shares, each at its fraction of the GPU's price."""
    if not slices:
        return []
    rows = [{**x, "what": f"{x['gpu_model']} {x['slice']}"} for x in slices]
    return [Paragraph("Of which slices of GPUs", _H2), _figures_table(rows, "what", "Slice", currency)]


def _header(title: str, report: dict[str, Any]) -> list[Flowable]:
    status = {"closed": "closed (final)", "open": "open (provisional)", "reopened": "re-opened (provisional)"}
    return [
        Paragraph(f"{settings.PORTAL_NAME} — {title}", _H1),
        Paragraph(
            f"Month <b>{report['month']}</b> · status {status.get(report['status'], report['status'])} · "
            f"currency {report['currency']} · generated {report['generated_at'][:19].replace('T', ' ')} UTC",
            _SMALL,
        ),
        Spacer(1, 6 * mm),
    ]


def _team_section(team: dict[str, Any], report: dict[str, Any]) -> list[Flowable]:
    currency = report["currency"]
    users = sorted(team["by_user"], key=lambda u: (-float(u["cost"]), u["user"]))
    shown, rest = users[:MAX_USERS_LISTED], users[MAX_USERS_LISTED:]
    flow: list[Flowable] = [
        *_header(f"Statement for {team['name']} ({team['team']})", report),
        Paragraph(f"Amount due: <b>{_money(team['cost'], currency)}</b>", _styles["Heading2"]),
        Paragraph(
            f"{team['gpu_hours']} GPU-hours · idle cost {_money(team['idle_cost'], currency)} · mean utilization "
            f"{_pct(team['mean_utilization'])}",
            _BODY,
        ),
        Paragraph("By GPU model", _H2),
        _figures_table(team["by_gpu_model"], "gpu_model", "GPU model", currency, total=team),
        Paragraph("By user", _H2),
        _figures_table(shown, "user", "User", currency, total=team),
        *_slices_table(team["by_slice"], currency),
    ]
    if rest:
        flow.append(Paragraph(f"{len(rest)} more users are included in the total.", _SMALL))
    if not team["idle_cost_complete"]:
        flow.append(
            Paragraph(
                f"* {team['unknown_utilization_gpu_hours']} GPU-hours had no telemetry: their idle cost is unknown "
                "and not included.",
                _SMALL,
            )
        )
    lines = pdf_lines(team_slug=team["team"], month=parse_month(report["month"]))
    if lines:
        flow.append(Paragraph("Efficiency", _H2))
        flow.extend(Paragraph(line, _BODY) for line in lines)
    flow.append(Spacer(1, 4 * mm))
    flow.append(
        Paragraph(
            "Billed by the second from GPU allocations (reservations held, jobs run outside reservations); idle cost "
            "= cost x (1 - mean utilization).",
            _SMALL,
        )
    )
    # One page per team, whatever its length: shrink to fit rather than spill onto a second page.
    return [KeepInFrame(_FRAME_W, _FRAME_H, flow, mode="shrink")]


def _footer(canvas: Any, doc: Any) -> None:
    canvas.saveState()
    canvas.setFont("Helvetica", 8)
    canvas.setFillColor(colors.HexColor("#666666"))
    canvas.drawString(_MARGIN, 10 * mm, f"{settings.PORTAL_NAME} · {doc.title}")
    canvas.drawRightString(A4[0] - _MARGIN, 10 * mm, f"page {doc.page}")
    canvas.restoreState()


def _build(flow: list[Flowable], title: str) -> bytes:
    buffer = io.BytesIO()
    doc = SimpleDocTemplate(
        buffer,
        pagesize=A4,
        leftMargin=_MARGIN,
        rightMargin=_MARGIN,
        topMargin=_MARGIN,
        bottomMargin=_MARGIN + 8 * mm,
        title=title,
        author=settings.PORTAL_NAME,
    )
    doc.build(flow, onFirstPage=_footer, onLaterPages=_footer)
    return buffer.getvalue()


def team_statement(report: dict[str, Any], team_slug: str) -> bytes:
    """One team's statement for the report's month: one page."""
    team = next(t for t in report["teams"] if t["team"] == team_slug)
    return _build(_team_section(team, report), f"Statement {team_slug} {report['month']}")


def fleet_statement(report: dict[str, Any]) -> bytes:
    """Summary page (every team, every GPU model, totals), then one page per team."""
    currency = report["currency"]
    totals = report["totals"]
    summary: list[Flowable] = [
        *_header("Monthly GPU cost report", report),
        Paragraph(f"Total: <b>{_money(totals['cost'], currency)}</b> for {totals['gpu_hours']} GPU-hours", _H2),
        Paragraph("By team", _H2),
        _figures_table(report["teams"], "team", "Team", currency, total=totals),
        Paragraph("By GPU model", _H2),
        _figures_table(totals["by_gpu_model"], "gpu_model", "GPU model", currency, total=totals),
        *_slices_table(totals["by_slice"], currency),
    ]
    if not report["teams"]:
        summary.append(Paragraph("No usage this month.", _BODY))
    flow: list[Flowable] = [KeepInFrame(_FRAME_W, _FRAME_H, summary, mode="shrink")]
    for team in report["teams"]:
        flow.append(PageBreak())
        flow.extend(_team_section(team, report))
    return _build(flow, f"GPU cost report {report['month']}")
