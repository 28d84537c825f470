"""The idle warning reaches the holder's open page live (Chromium, the live server, its websocket): the scan warns,
the banner appears without a reload."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import Client

from apps.booking import services as booking
from apps.efficiency import services
from tests.booking.conftest import slot
from tests.browser.test_pages import CHROMIUM_ARGS, signed_in
from tests.efficiency.conftest import write_minutes

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]


def test_warning_appears_live_on_the_open_page(
    live_portal: Any, alice: Any, fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    start, end = slot(hours=4)
    r = booking.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, gpus=["GPU-big-0"]
    ).reservation
    booking.reservations_tick(now=start)
    write_minutes(fleet["gpus"]["big/0"], start, 5, util=90, mem=40000)
    write_minutes(fleet["gpus"]["big/0"], start + timedelta(minutes=5), 65, util=0, mem=0)
    with signed_in(live_portal, alice, monkeypatch) as page:
        frames: list[str] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))
        page.goto(live_portal.url + "/")
        assert page.locator("#idle-banner").is_hidden()
        # The team socket sends its first message once it joined the team's group: from then on it hears pushes.
        for _ in range(100):
            if any("team.usage" in f for f in frames):
                break
            page.wait_for_timeout(100)
        # In its own thread, as the beat task runs it: Playwright's event loop owns this one.
        result: list[Any] = []

        def scan() -> None:
            try:
                result.append(services.idle_scan(now=start + timedelta(minutes=71)))
            finally:
                connection.close()

        worker = threading.Thread(target=scan)
        worker.start()
        worker.join()
        assert result[0].warned == [f"reservations/{r.pk}"]
        page.wait_for_selector(f"#idle-banner >> text=reservation #{r.pk} has been idle")
        assert "will be reclaimed at" in page.inner_text("#idle-banner")


@contextmanager
def signed_in_expecting_409(live: Any, user: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """As tests.browser's `signed_in`, except that Chromium's console line for the refusal (409) is expected."""
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client = Client()
    client.force_login(user)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_cookies([{**cookie, "url": live.url}])
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: m.type == "error" and "status of 409" not in m.text and errors.append(m.text))
            page.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}"))
            yield page
            assert not errors, errors
        finally:
            browser.close()
            connections.close_all()


def test_refused_booking_offers_the_waitlist(
    live_portal: Any, alice: Any, bob: Any, fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.efficiency.models import WaitlistEntry

    start, end = slot(days=1, hour=10, hours=2)
    booking.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, gpu_model="H100-80GB", gpu_count=2
    )
    local = "iso => { const d = new Date(iso); const p = n => String(n).padStart(2, '0'); return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`; }"  # noqa: E501
    with signed_in_expecting_409(live_portal, bob, monkeypatch) as page:
        page.goto(live_portal.url + "/book/")
        page.wait_for_selector(".tl-row")
        page.select_option("#book-team", "vision")
        page.select_option("#book-model", "H100-80GB")
        page.fill("#book-count", "1")
        page.fill("#book-start", page.evaluate(local, start.isoformat()))
        page.fill("#book-end", page.evaluate(local, end.isoformat()))
        page.click("#book-submit")
        page.wait_for_selector("#waitlist-join")
        page.check("#waitlist-auto")
        page.click("#waitlist-join")
        page.wait_for_selector("#waitlist-status >> text=On the waitlist")
    entry = WaitlistEntry.objects.get(user=bob)
    assert (entry.gpu_model.name, entry.gpu_count, entry.start, entry.end, entry.auto_book) == (
        "H100-80GB",
        1,
        start,
        end,
        True,
    )
