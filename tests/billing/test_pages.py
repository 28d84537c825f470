"""The Costs pages and the PDF statements: who sees what, and that the PDFs open with a page per team."""

from __future__ import annotations

import io
import json

import pytest
from pypdf import PdfReader

pytestmark = pytest.mark.django_db


def _get(client, user, url):
    if user is not None:
        client.force_login(user)
    return client.get(url)


def test_admin_sees_the_fleet_report_with_charts(october, client, admin):
    resp = _get(client, admin, "/costs/?month=2026-10")
    assert resp.status_code == 200
    html = resp.content.decode()
    for marker in ('id="chart-team-model"', 'id="chart-daily"', 'id="chart-idle"', 'id="heatmap"', 'id="comparison"'):
        assert marker in html
    assert "/api/v1/reports/monthly/?month=2026-10&amp;format=csv" in html
    assert "/costs/report/2026-10.pdf" in html
    assert 'class="nav-disabled"' not in html.split("Costs</a>")[0][-300:]  # the nav link is live
    data = json.loads(html.split('id="costs-data" type="application/json">')[1].split("</script>")[0])
    assert data["cost_by_team_model"]["teams"] == ["nlp", "vision"]
    assert len(data["daily"]["days"]) == 31 and len(data["heatmap"]["gpus"]) == 3  # the GPU without telemetry is blank
    assert "65.80" in html


def test_the_unknown_idle_cost_note_shows_only_where_a_row_is_marked(october, client, admin):
    html = _get(client, admin, "/costs/?month=2026-10").content.decode()
    assert 'title="10.00 GPU-hours without telemetry">*</span>' in html and 'id="idle-unknown-note"' in html
    from apps.billing.models import UsageRecord

    UsageRecord.objects.filter(mean_utilization__isnull=True).delete()  # every row left has its utilization
    html = client.get("/costs/?month=2026-10").content.decode()
    assert 'id="report-teams"' in html and "without telemetry" not in html


def test_a_manager_sees_her_teams_report(october, client, alice):
    html = _get(client, alice, "/costs/?month=2026-10").content.decode()
    assert 'id="report-teams"' in html and "53.30" in html and "12.50" not in html


def test_a_member_sees_his_teams_cost_but_no_report(october, client, bob):
    resp = _get(client, bob, "/costs/?month=2026-10")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'id="report-forbidden"' in html and 'id="report-teams"' not in html
    assert "/costs/teams/vision/" in html


def test_anonymous_is_sent_to_sign_in(client):
    resp = client.get("/costs/")
    assert resp.status_code == 302 and "/accounts/login/" in resp["Location"]


def test_bad_month_is_400(client, admin):
    assert _get(client, admin, "/costs/?month=2026-99").status_code == 400


@pytest.mark.parametrize("who,status", [("bob", 200), ("alice", 200), ("admin", 200), ("charlie", 404)])
def test_team_page(october, client, alice, bob, charlie, admin, who, status):
    user = {"alice": alice, "bob": bob, "charlie": charlie, "admin": admin}[who]
    resp = _get(client, user, "/costs/teams/vision/")
    assert resp.status_code == status
    if status == 200:
        html = resp.content.decode()
        assert 'id="chart-burn"' in html and 'id="burn-data"' in html and 'id="quota"' in html


def _pdf(resp) -> PdfReader:
    assert resp.status_code == 200, resp.content[:200]
    assert resp["Content-Type"] == "application/pdf"
    return PdfReader(io.BytesIO(resp.content))


def test_fleet_pdf_has_a_summary_then_one_page_per_team(october, client, admin):
    reader = _pdf(_get(client, admin, "/costs/report/2026-10.pdf"))
    texts = [page.extract_text() for page in reader.pages]
    assert len(texts) == 1 + 2
    assert "Monthly GPU cost report" in texts[0] and "65.80" in texts[0]
    assert "Statement for NLP (nlp)" in texts[1] and "12.50" in texts[1]
    assert "Statement for Computer Vision (vision)" in texts[2] and "53.30" in texts[2] and "bob" in texts[2]


def test_team_pdf_is_one_page(october, client, alice):
    reader = _pdf(_get(client, alice, "/costs/report/2026-10/vision.pdf"))
    assert len(reader.pages) == 1
    assert "Amount due: 53.30 EUR" in reader.pages[0].extract_text()


def test_a_team_with_many_users_still_fits_one_page(october, client, admin, vision):
    from datetime import timedelta

    from apps.billing import services
    from tests.billing import helpers
    from tests.factories import UserFactory

    gpu = helpers.gpus(1, node="many-users")[0]
    start = october["job"].start + timedelta(days=1)
    for i in range(60):
        user = UserFactory(username=f"user-{i:02d}")
        helpers.run_job(vision, user, gpu, start + timedelta(hours=i), start + timedelta(hours=i, minutes=30))
    from datetime import UTC, datetime

    services.ledger_close(now=datetime(2026, 11, 6, tzinfo=UTC))
    reader = _pdf(_get(client, admin, "/costs/report/2026-10/vision.pdf"))
    assert len(reader.pages) == 1
    assert "more users are included in the total" in reader.pages[0].extract_text()


@pytest.mark.parametrize(
    "who,url,status",
    [
        ("bob", "/costs/report/2026-10.pdf", 403),
        ("bob", "/costs/report/2026-10/vision.pdf", 403),
        ("charlie", "/costs/report/2026-10/vision.pdf", 404),
        ("admin", "/costs/report/2099-01.pdf", 400),
    ],
)
def test_pdf_refusals(october, client, admin, bob, charlie, who, url, status):
    user = {"admin": admin, "bob": bob, "charlie": charlie}[who]
    assert _get(client, user, url).status_code == status


def test_manager_fleet_pdf_has_only_her_team(october, client, alice):
    reader = _pdf(_get(client, alice, "/costs/report/2026-10.pdf"))
    assert len(reader.pages) == 2


def test_a_month_in_progress_is_compared_with_the_previous_month_up_to_the_same_point(october, client, admin):
    """On 5 November at 13:00 the comparison reads October to 5 October 13:00: bob's 10-hour booking of two A100s
    from 5 October 08:00 counts for its first five hours (25.00 of 50.00), alice's 3-hour job from 08:00 wholly
    (3.30), charlie's job on 21 October not at all. A past month is still set against the whole previous one."""
    from datetime import UTC, datetime, timedelta

    from apps.accounts.models import Team
    from apps.billing import selectors, services
    from tests.billing import helpers

    vision, nlp = Team.objects.get(slug="vision"), Team.objects.get(slug="nlp")
    g1, _g2, g3, _g4 = october["gpus"]
    nov2 = datetime(2026, 11, 2, 9, tzinfo=UTC)
    helpers.reserve(vision, admin, [g1], nov2, nov2 + timedelta(hours=4))  # 10.00
    helpers.run_job(nlp, admin, g3, nov2, nov2 + timedelta(hours=2))  # 5.00
    now = datetime(2026, 11, 5, 13, tzinfo=UTC)
    services.ledger_close(now=now)
    november = datetime(2026, 11, 1).date()
    report = selectors.monthly_report(user=admin, month=november)
    comparison = selectors.month_comparison(month=november, report=report, user=admin, now=now)
    rows = {r["team"]: r for r in comparison["rows"]}
    assert comparison["to"] == datetime(2026, 10, 5, 13, tzinfo=UTC)
    assert rows["vision"]["previous_cost"] == "28.30" and rows["vision"]["cost"] == "10.00"
    assert rows["vision"]["previous_gpu_hours"] == "13.000"  # 2 GPUs x 5 h + 3 h
    assert rows["vision"]["change_percent"] == "-64.7"
    assert rows["nlp"]["previous_cost"] == "0.00" and rows["nlp"]["change_percent"] is None

    nov3 = datetime(2026, 11, 3, tzinfo=UTC)
    helpers.reserve(nlp, admin, [g3], nov3, nov3 + timedelta(hours=20))  # 50.00
    later = datetime(2026, 11, 25, tzinfo=UTC)
    services.ledger_close(now=later)
    report = selectors.monthly_report(user=admin, month=november)
    rows = {
        r["team"]: r for r in selectors.month_comparison(month=november, report=report, user=admin, now=later)["rows"]
    }
    assert (rows["nlp"]["previous_cost"], rows["nlp"]["cost"], rows["nlp"]["change_percent"]) == (
        "12.50",
        "55.00",
        "+340.0",
    )

    october_first = datetime(2026, 10, 1).date()
    october_report = selectors.monthly_report(user=admin, month=october_first)
    whole = selectors.month_comparison(month=october_first, report=october_report, user=admin, now=now)
    assert whole["to"] is None  # September had nothing: October is not in progress
    assert {r["previous_cost"] for r in whole["rows"]} == {"0.00"}

    client.force_login(admin)
    with pytest.MonkeyPatch.context() as mp:
        from django.utils import timezone

        mp.setattr(timezone, "now", lambda: now)
        html = client.get("/costs/").content.decode()
    assert 'id="comparison-to"' in html and "up to the same point (5 Oct 13:00)" in html and "28.30" in html
