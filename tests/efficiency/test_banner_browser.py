"""The idle warning reaches the holder's open page live (Chromium, the live server, its websocket): the scan warns,
the banner appears without a reload."""

from __future__ import annotations

import shutil
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from apps.booking import services as booking
from apps.efficiency import services
from tests.booking.conftest import slot
from tests.browser.test_pages import signed_in
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
