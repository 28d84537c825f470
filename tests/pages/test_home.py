"""The home page: my unfinished jobs, my next reservations, my teams' spend this month with its chart data."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

from apps.booking.models import ReservationStatus
from apps.jobs.models import JobState
from tests.billing import helpers
from tests.factories import UserFactory
from tests.pages import builders


def _home(user: Any) -> str:
    client = Client()
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    return response.content.decode()


def _section(html: str, section_id: str) -> str:
    start = html.index(f'id="{section_id}"')
    return html[start : html.index("</section>", start)]


def test_home_lists_my_unfinished_jobs_only(vision: Any, alice: Any, bob: Any) -> None:
    running = builders.job(vision, bob, state=JobState.RUNNING, name="mine, running")
    queued = builders.job(vision, bob, name="mine, queued")
    done = builders.job(vision, bob, state=JobState.SUCCEEDED, name="mine, done")
    teammate = builders.job(vision, alice, state=JobState.RUNNING, name="alice's")
    jobs = _section(_home(bob), "home-jobs")
    assert f"/jobs/{running.pk}/" in jobs and f"/jobs/{queued.pk}/" in jobs
    assert f"/jobs/{done.pk}/" not in jobs and f"/jobs/{teammate.pk}/" not in jobs
    assert "running" in jobs and "queued" in jobs


def test_home_lists_my_next_reservations(vision: Any, alice: Any, bob: Any) -> None:
    now = timezone.now()
    current = builders.reservation(vision, bob, start=now - timedelta(hours=1), status=ReservationStatus.ACTIVE)
    upcoming = builders.reservation(vision, bob, start=now + timedelta(days=2))
    past = builders.reservation(vision, bob, start=now - timedelta(days=1), status=ReservationStatus.RELEASED)
    alices = builders.reservation(vision, alice)
    section = _section(_home(bob), "home-reservations")
    assert f"#{current.pk} " in section and f"#{upcoming.pk} " in section
    assert f"#{past.pk} " not in section and f"#{alices.pk} " not in section
    assert "<strong>now</strong>" in section
    assert f"/jobs/new/?team=vision&amp;reservation={upcoming.pk}" in section


def test_home_shows_my_teams_spend_this_month_with_chart_data(vision: Any, bob: Any) -> None:
    [gpu] = helpers.gpus(1, model=helpers.gpu_model("A100-80GB", "3.0000"))
    now = timezone.now()
    start = max(now - timedelta(hours=2), timezone.localtime(now).replace(day=1, hour=0, minute=0, second=0))
    helpers.run_job(vision, bob, gpu, start, now)
    html = _home(bob)
    spend = _section(html, "home-spend")
    assert "/costs/teams/vision/" in spend and " EUR</strong>" in spend and "GPU-hours" in spend
    assert 'id="home-spend-chart"' in spend
    chart = json.loads(html.split('id="home-spend-data" type="application/json">')[1].split("</script>")[0])
    assert chart["days"][-1] == timezone.localdate(now).isoformat()  # up to today, not the whole month
    [series] = chart["series"]
    assert series["team"] == "vision" and float(series["values"][-1]) > 0


def test_home_for_someone_without_a_team(admin: Any) -> None:
    html = _home(UserFactory(username="newcomer"))
    assert "No job of yours is queued or running." in html
    assert "You have no reservation coming up." in html
    assert "You are not in a team yet." in html and 'id="home-spend-chart"' not in html
    html = _home(admin)
    assert "You are in no team. Every team's spend is on the" in html
