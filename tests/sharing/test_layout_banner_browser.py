"""A MIG layout change that moves or ends a booking reaches the holder's open page live (Chromium, the live server,
its websocket): the banner says which reservation and what happened, without a reload."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from apps.booking.services import reservation_create
from apps.fleet.models import Gpu
from tests.booking.conftest import slot
from tests.browser.test_pages import BROWSER_MARKS, open_listening, signed_in
from tests.factories import GpuModelFactory, NodeFactory
from tests.sharing.test_layout_strands import SEVEN, register

pytestmark = BROWSER_MARKS


def test_a_moved_and_an_ended_booking_show_in_the_banner(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    node = NodeFactory(name="node-a")
    register(node, [SEVEN])
    start, end = slot(hours=2)
    mine = [
        reservation_create(user=alice, team=vision, start=start, end=end, mig_profile="1g.10gb").reservation
        for _ in range(2)
    ]
    with signed_in(live_portal, alice, monkeypatch) as page:
        open_listening(page, live_portal.url + "/")
        assert page.locator("#idle-banner").is_hidden()

        def repartition() -> None:  # the agent's registration, as the worker runs it
            try:
                register(node, ["A100-80GB:mig=1g.10gb+3g.40gb"], made=2)  # one 1g.10gb instance left
            finally:
                connection.close()

        worker = threading.Thread(target=repartition)
        worker.start()
        worker.join()
        page.wait_for_selector(f"#idle-banner >> text=reservation #{mine[0].pk} was moved")
        page.wait_for_selector(f"#idle-banner >> text=reservation #{mine[1].pk} was ended")
        text = page.inner_text("#idle-banner")
        assert "holds a 1g.10gb instance (A100-80GB) again" in text
        assert "no free device gives a 1g.10gb instance (A100-80GB)" in text
    assert Gpu.devices.filter(kind="mig", retired_at__isnull=True).count() == 2
