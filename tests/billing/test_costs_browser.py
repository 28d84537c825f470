"""The Costs pages in headless Chromium against the live server: the report's charts and heatmap draw, the team
page draws its burn-down and goes live over its websocket."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tests.billing import helpers

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser_as(live_portal: Any) -> Iterator[Any]:
    """`browser_as(user)` → a Playwright page signed in as `user` (session cookie made by the test client)."""
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (make system-deps)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)

        def session_for(user: Any) -> str:
            client = Client()
            client.force_login(user)
            return str(client.cookies["sessionid"].value)

        def make(user: Any) -> Any:
            # Playwright's sync API runs an event loop in this thread: the ORM must run in another.
            with ThreadPoolExecutor(1) as pool:
                session = pool.submit(session_for, user).result()
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-GB")
            context.add_cookies([{"name": "sessionid", "value": session, "url": live_portal.url}])
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.base = live_portal.url
            return page

        yield make
        browser.close()
    assert not errors, errors


def _painted(page: Any, selector: str) -> bool:
    """Whether a canvas has non-transparent pixels (Chart.js drew something)."""
    return bool(
        page.eval_on_selector(
            selector,
            """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                      for (let i = 3; i < d.length; i += 4) if (d[i] > 0) return true; return false; }""",
        )
    )


def test_the_report_page_draws_its_charts(october, admin, browser_as):
    page = browser_as(admin)
    page.goto(f"{page.base}/costs/?month=2026-10")
    for chart in ("#chart-team-model", "#chart-daily", "#chart-idle"):
        page.wait_for_selector(f'{chart}[data-rendered="1"]', timeout=10_000)
        assert _painted(page, chart), chart
    page.wait_for_selector('#heatmap[data-rendered="1"]')
    assert page.locator("#heatmap tbody tr").count() == 3
    assert page.locator("#heatmap td[data-util]").count() == 3  # GPU-days with telemetry: 2 on Oct 5, 1 on Oct 21
    assert page.locator("#report-teams tbody tr").count() == 2
    assert "65.80" in page.inner_text("#total-cost")
    # The CSV link works with the session.
    csv_text = page.evaluate("fetch('/api/v1/reports/monthly/?month=2026-10&format=csv').then(r => r.text())")
    assert csv_text.startswith("month,team,section,key")


@pytest.fixture
def running(vision: Any, bob: Any) -> None:
    from apps.booking.models import Quota

    Quota.objects.create(team=vision, budget_soft=100, budget_hard=150)
    now = timezone.now()
    helpers.reserve(vision, bob, helpers.gpus(2), now - timedelta(hours=2), now + timedelta(hours=2))


def test_the_team_page_draws_the_burn_down_and_goes_live(running, browser_as, bob):
    page = browser_as(bob)
    page.goto(f"{page.base}/costs/teams/vision/")
    page.wait_for_selector('#chart-burn[data-rendered="1"]')
    assert _painted(page, "#chart-burn")
    page.wait_for_function("() => document.getElementById('live-state').textContent === 'live'", timeout=10_000)
    assert float(page.inner_text("#live-cost")) >= 9.99  # 2 GPUs x 2 h x 2.50
    assert page.inner_text("#live-running") == "2"
