"""A MIG layout change that moves or ends a booking reaches the holder's open page live (Chromium, the live server,
its websocket): the banner says which reservation and what happened, without a reload."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from apps.booking.services import reservation_create, reservations_tick
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


def test_the_book_page_follows_a_move_and_lists_an_end_with_its_reason(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the Book page, "My reservations" shows where a moved booking went and "Ended in the last 7 days" shows
    an ended one with the reason in words, live (the banner's notification makes the page reload its lists); one
    that ran to its end is not listed."""
    GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    node_a, node_b = NodeFactory(name="node-a"), NodeFactory(name="node-b")
    (a0,) = register(node_a, ["A100-80GB"])
    register(node_b, ["A100-80GB"])
    start, end = slot(hours=2)
    gpu = Gpu.objects.get(uuid=a0.uuid)
    # One that ran to its end is released too, but did not end early: the list leaves it out.
    ran = reservation_create(
        user=alice, team=vision, start=start + timedelta(days=3), end=end + timedelta(days=3), gpus=[gpu.uuid]
    ).reservation
    reservations_tick(now=ran.start)
    reservations_tick(now=ran.end)
    first = reservation_create(user=alice, team=vision, start=start, end=end, gpus=[gpu.uuid]).reservation
    second = reservation_create(
        user=alice, team=vision, start=start + timedelta(days=1), end=end + timedelta(days=1), gpus=[gpu.uuid]
    ).reservation
    with signed_in(live_portal, alice, monkeypatch) as page:
        open_listening(page, live_portal.url + "/book/")
        row = page.locator(f'#my-reservations tr[data-reservation-id="{first.pk}"]')
        row.wait_for()
        assert "node-a/0" in row.inner_text()
        page.wait_for_function(
            "() => !document.querySelector('#ended-reservations tbody').innerText.includes('Loading')"
        )
        assert page.locator("#ended-reservations tbody").inner_text().strip() == "None."

        def change() -> None:  # node-a's GPU 0 enters MIG mode; node-b's GPU is free on day 1 only
            try:
                reservation_create(
                    user=alice, team=vision, start=start + timedelta(days=1), end=end + timedelta(days=1),
                    gpus=[Gpu.objects.get(node=node_b).uuid],
                )  # fmt: skip
                register(node_a, [SEVEN], made=2)
            finally:
                connection.close()

        worker = threading.Thread(target=change)
        worker.start()
        worker.join()
        page.wait_for_function(
            "id => (document.querySelector(`#my-reservations tr[data-reservation-id='${id}']`) || {}).innerText"
            "?.includes('node-b/0')",
            arg=first.pk,
        )
        ended = page.locator(f'#ended-reservations tr[data-reservation-id="{second.pk}"]')
        ended.wait_for()
        text = ended.inner_text()
        assert "cancelled" in text and "the MIG layout of its GPU changed" in text
        # The two lists reload with separate requests: the ended one may be drawn first.
        page.locator(f'#my-reservations tr[data-reservation-id="{second.pk}"]').wait_for(state="detached")
