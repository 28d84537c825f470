"""The Book page in headless Chromium: book a 1g.10gb instance and a quarter of a shared GPU by the form, and see
them on their GPUs' rows as lanes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from apps.booking.models import Reservation
from tests.booking.conftest import slot
from tests.booking.test_book_page_browser import CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(live_portal: Any, alice: Any, sharing_fleet: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (make system-deps)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        context = browser.new_context(timezone_id="UTC", locale="en-GB", viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{live_portal.url}/accounts/login/")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", "pw-for-tests")
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_portal.url}/")
        page.goto(f"{live_portal.url}/book/")
        page.wait_for_selector(".tl-row[data-gpu-uuid]")
        try:
            yield page
            assert not errors, errors
        finally:
            browser.close()
            connections.close_all()


def _book(page: Any, part: str, note: str, start: Any, end: Any) -> Reservation:
    page.select_option("#book-part", part)
    page.fill("#book-count", "1")
    page.fill("#book-start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-end", end.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-note", note)
    page.click("#book-submit")
    page.wait_for_selector("#book-success:not([hidden])")
    return Reservation.objects.get(note=note)


def test_book_an_instance_and_a_share_by_the_form(page, sharing_fleet):
    options = page.locator("#book-part option").all_inner_texts()
    assert "MIG instance 1g.10gb" in options and "0.25 of a shared GPU (no memory isolation)" in options
    start, end = slot(days=1, hour=10, hours=2)
    mig = _book(page, "mig:1g.10gb", "an instance", start, end)
    assert f"Booked #{mig.pk}: mig/0 · 1g.10gb," in page.inner_text("#book-success")
    quarter = _book(page, "share:0.25", "a quarter", start, end)
    assert f"Booked #{quarter.pk}: shared/0 · 0.25 of it," in page.inner_text("#book-success")
    half = _book(page, "share:0.5", "a half", start, end)  # two shares of one GPU, named once
    assert f"Booked #{half.pk}: shared/0 · 0.5 of it," in page.inner_text("#book-success")
    row = page.locator(f'#my-reservations tr[data-reservation-id="{half.pk}"]')
    row.wait_for()
    assert "shared/0 · 0.5 of it" in row.inner_text()
    assert mig.allocations.get().gpu.mig_profile == "1g.10gb"
    assert quarter.allocations.get().gpu.parent_id == sharing_fleet["shared"].pk
    lane = page.locator(f'.tl-slot.mine[data-reservation-id="{quarter.pk}"]')
    lane.wait_for()
    assert lane.inner_text().startswith("25% · vision")
    assert "height:25%" in (lane.get_attribute("style") or "").replace(" ", "")
    row = page.locator('.tl-row[data-gpu-uuid="GPU-mig-0"] .tl-slot.mine')
    assert row.first.inner_text().startswith("1g.10gb · vision")


def test_the_quota_line_counts_a_part_as_its_fraction(page, sharing_fleet, vision):
    from decimal import Decimal

    from apps.booking.models import Quota

    Quota.objects.create(team=vision, month=None, gpu_hours=Decimal("1"))
    start, end = slot(days=1, hour=10, hours=2)
    page.fill("#book-count", "1")
    page.fill("#book-start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-end", end.strftime("%Y-%m-%dT%H:%M"))
    page.wait_for_selector("#book-quota [data-fits='false']")  # a whole GPU for 2 h: 2 GPU-hours > 1
    page.select_option("#book-part", "share:0.25")
    page.wait_for_selector("#book-quota [data-fits='true']")  # a quarter for 2 h: half a GPU-hour
    assert "uses 0.5" in page.inner_text("#book-quota")


def test_the_part_and_the_model_stay_consistent_and_the_booking_is_of_that_model(page, sharing_fleet, vision):
    """An H100-80GB without parts beside the A100s: choosing it sets a quarter back to whole GPUs, choosing a quarter
    again picks the A100 back, and the booking of the part names the model chosen."""
    from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

    GpuFactory(node=NodeFactory(name="plain"), index=0, model=GpuModelFactory(name="H100-80GB"), uuid="GPU-h100-0")
    page.reload()
    page.wait_for_selector(".tl-row[data-gpu-uuid]")
    models = page.locator("#book-model option").all_inner_texts()
    assert set(models) == {"A100-80GB", "H100-80GB"}, models
    page.select_option("#book-part", "share:0.25")
    page.select_option("#book-model", "H100-80GB")
    assert page.input_value("#book-part") == ""
    page.select_option("#book-part", "share:0.25")
    assert page.input_value("#book-model") == "A100-80GB"
    start, end = slot(days=1, hour=10, hours=2)
    quarter = _book(page, "share:0.25", "a quarter of an A100", start, end)
    assert quarter.gpu_model.name == "A100-80GB"
    assert quarter.allocations.get().gpu.parent_id == sharing_fleet["shared"].pk


def test_a_refused_share_offers_to_wait_for_that_share(page, alice, sharing_fleet):
    from apps.booking import services as booking
    from apps.efficiency.models import WaitlistEntry

    start, end = slot(days=1, hour=10, hours=2)
    team = alice.memberships.first().team
    booking.reservation_create(user=alice, team=team, start=start, end=end, gpu_share=1, gpu_model="A100-80GB")
    page.select_option("#book-part", "share:0.25")
    page.fill("#book-start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-end", end.strftime("%Y-%m-%dT%H:%M"))
    page.click("#book-submit")
    button = page.locator("#waitlist-join")
    button.wait_for()
    assert button.inner_text() == "Wait for this share"
    page.check("#waitlist-auto")
    button.click()
    page.wait_for_selector("#waitlist-status >> text=On the waitlist")
    entry = WaitlistEntry.objects.get(user=alice)
    assert (str(entry.gpu_share), entry.mig_profile, entry.gpu_count, entry.start, entry.end, entry.auto_book) == (
        "0.250000",
        "",
        1,
        start,
        end,
        True,
    )


def test_the_window_is_drawn_only_on_gpus_that_can_take_the_part(page, sharing_fleet):
    """The chosen window is outlined on each GPU of the model that could take it: a whole GPU never lands on the GPU
    in MIG mode, an instance only there, a share only on the GPU split in shares."""
    start, end = slot(days=1, hour=10, hours=2)
    page.fill("#book-start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-end", end.strftime("%Y-%m-%dT%H:%M"))

    def outlined(part: str) -> set[str]:
        page.select_option("#book-part", part)
        page.wait_for_selector(".tl-pick")
        return set(page.eval_on_selector_all(".tl-pick", "ps => ps.map(p => p.closest('.tl-row').dataset.gpuUuid)"))

    assert outlined("mig:1g.10gb") == {"GPU-mig-0"}
    assert outlined("share:0.25") == {"GPU-shared-0"}
    assert outlined("") == {"GPU-mig-1", "GPU-shared-0", "GPU-shared-1"}


def test_a_drag_on_the_gpu_in_mig_mode_books_one_of_its_instances(page, sharing_fleet):
    """A GPU in MIG mode is never booked whole: picking it on the timeline asks for one of its instances."""
    page.select_option("#tl-days", "3")
    page.wait_for_selector('#timeline[data-days="3"]')
    track = page.locator('.tl-row[data-gpu-uuid="GPU-mig-0"] .tl-track')
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * (24 + 18) / 72 + 1, y)  # tomorrow 18:00 -> 20:00
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * (24 + 20) / 72 - 1, y, steps=5)
    page.mouse.up()
    assert page.input_value("#book-part") == "mig:1g.10gb"
    page.click("#book-submit")
    page.wait_for_selector("#book-success:not([hidden])")
    reservation = Reservation.objects.get()
    (allocation,) = reservation.allocations.select_related("gpu")
    assert (allocation.gpu.parent_id, allocation.gpu.mig_profile) == (sharing_fleet["mig"].pk, "1g.10gb")
