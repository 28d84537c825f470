"""The Book page in headless Chromium against the live server: book by the form, see it on the timeline, see a
conflict refused inline, pick a GPU by dragging on its row, cancel from "my reservations"."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from apps.booking import services
from apps.booking.models import Reservation, ReservationStatus
from apps.fleet.models import Gpu
from tests.booking.conftest import slot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page(live_portal: Any, alice: Any, fleet: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (make system-deps)")
    # Playwright's sync API keeps an event loop on this thread; the ORM calls the test makes between browser
    # steps are still plain synchronous calls (Playwright's documented setting for Django tests).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        context = browser.new_context(timezone_id="UTC", locale="en-GB", viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: d.accept())
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
            # The ORM calls made while Playwright's loop ran on this thread opened a connection that the test
            # database teardown does not see; left open, it blocked DROP DATABASE ("accessed by other users").
            connections.close_all()


def _fill(page: Any, *, model: str, count: int, start: Any, end: Any, note: str = "") -> None:
    page.select_option("#book-model", model)
    page.fill("#book-count", str(count))
    page.fill("#book-start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-end", end.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#book-note", note)


def test_book_by_form_and_see_it_on_the_timeline(page, fleet, alice, charlie, nlp):
    start, end = slot(days=1, hour=10, hours=3)
    _fill(page, model="A100-80GB", count=2, start=start, end=end, note="browser booking")
    # The availability answers each change of the form: wait for the one for the whole form, not an earlier one.
    page.wait_for_function(
        "() => document.querySelector('#book-availability')?.innerText.includes('12 of 12 A100-80GB free')"
    )
    page.click("#book-submit")
    page.wait_for_selector("#book-success:not([hidden])")
    reservation = Reservation.objects.get(note="browser booking")
    assert f"Booked #{reservation.pk}" in page.inner_text("#book-success")
    slots = page.locator(f'.tl-slot.mine[data-reservation-id="{reservation.pk}"]')
    slots.first.wait_for()
    assert slots.count() == 2
    # The timeline and the "my reservations" table reload side by side after a booking; wait for the table too.
    mine = page.locator(f'#my-reservations tr[data-reservation-id="{reservation.pk}"]')
    mine.first.wait_for()
    assert mine.count() == 1
    # Availability follows: the same window now has 10 free.
    page.fill("#book-note", "")
    page.dispatch_event("#book-start", "change")
    page.wait_for_function("() => document.querySelector('#book-availability [data-free]')?.dataset.free === '10'")
    # "+1 h" in the list ends it an hour later.
    booked_end = reservation.end
    mine.first.locator('button[data-action="extend"]').click()
    for _ in range(100):
        reservation.refresh_from_db()
        if reservation.end != booked_end:
            break
        time.sleep(0.1)
    assert reservation.end == booked_end + timedelta(hours=1)
    # The row's number opens the reservation's page, which lists the two GPUs it holds.
    mine.first.locator(f'a[href="/book/reservations/{reservation.pk}/"]').click()
    page.wait_for_selector("#reservation-page")
    assert f"Reservation #{reservation.pk}" in page.inner_text("h1")
    assert page.locator("#res-devices tbody tr[data-uuid]").count() == 2
    # Its end moves from that page: an hour later (the field shows and takes the portal's local time).
    later = timezone.localtime(reservation.end) + timedelta(hours=1)
    assert page.input_value("#change-end") == timezone.localtime(reservation.end).strftime("%Y-%m-%dT%H:%M")
    page.fill("#change-end", later.strftime("%Y-%m-%dT%H:%M"))
    page.click("#change-end-button")
    page.wait_for_selector(".messages .msg-success")
    assert f"now ends at {later:%Y-%m-%d %H:%M}" in page.inner_text(".messages")
    reservation.refresh_from_db()
    assert reservation.end == later
    # Into another team's booking: refused on the page, nothing changed.
    held = Gpu.objects.filter(allocations__reservation=reservation).order_by("uuid").first()
    services.reservation_create(user=charlie, team=nlp, start=later, end=later + timedelta(hours=1), gpus=[held.uuid])
    page.fill("#change-end", (later + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M"))
    page.click("#change-end-button")
    page.wait_for_selector(".messages .msg-error")
    assert "already held" in page.inner_text(".messages")
    reservation.refresh_from_db()
    assert reservation.end == later


def test_conflict_is_refused_inline(page, fleet, charlie, nlp):
    start, end = slot(days=1, hour=14, hours=2)
    services.reservation_create(user=charlie, team=nlp, start=start, end=end, gpu_model="H100-80GB", gpu_count=2)
    page.click("#tl-today")  # reload the timeline with the other team's booking
    page.locator(".tl-slot.other").first.wait_for()
    assert page.locator(".tl-slot.other").first.inner_text() == "nlp"
    _fill(page, model="H100-80GB", count=1, start=start, end=end)
    page.click("#book-submit")
    page.wait_for_selector("#book-error:not([hidden])")
    text = page.inner_text("#book-error")
    assert "Not enough H100-80GB GPUs are free" in text
    assert "held by nlp" in text
    assert Reservation.objects.filter(team__slug="vision").count() == 0


def test_quota_refusal_is_shown_with_what_is_left(page, fleet, vision):
    from decimal import Decimal

    from apps.booking.models import Quota

    Quota.objects.create(team=vision, gpu_hours=Decimal("3"))
    start, end = slot(days=1, hour=9, hours=2)
    _fill(page, model="A100-80GB", count=2, start=start, end=end)
    page.wait_for_selector("#book-quota [data-fits='false']")
    page.click("#book-submit")
    page.wait_for_selector("#book-error:not([hidden])")
    assert "3.00 GPU-h left" in page.inner_text("#book-error")


def test_a_drag_over_past_hours_keeps_its_length_from_now(page, fleet):
    # The browser's clock says 22:00 today; the drag covers 18:00 -> 21:00, all of it already past.
    today = page.evaluate("(() => { const d = new Date(); d.setHours(22, 0, 0, 0); return d.getTime(); })()")
    page.clock.set_fixed_time(today / 1000)
    page.select_option("#tl-days", "1")
    page.wait_for_selector('#timeline[data-days="1"]')  # redrawn for the new window before the drag
    track = page.locator('.tl-row[data-gpu-uuid="GPU-small-5"] .tl-track')
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 18 / 24 + 1, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 21 / 24 - 1, y, steps=5)
    page.mouse.up()
    start_value, end_value = page.input_value("#book-start"), page.input_value("#book-end")
    assert start_value.endswith("T22:00"), start_value
    assert end_value.endswith("T01:00") and end_value > start_value, end_value


def test_drag_on_a_row_picks_that_gpu_and_cancel(page, fleet):
    page.select_option("#tl-days", "3")
    page.wait_for_selector('#timeline[data-days="3"]')  # redrawn for the new window before the drag
    track = page.locator('.tl-row[data-gpu-uuid="GPU-small-5"] .tl-track')
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    # Tomorrow 18:00 -> 21:00 on a three-day timeline (the page's window starts at local midnight
    # today). Tomorrow, so that the drag is in the future whatever the time of day the test runs.
    page.mouse.move(box["x"] + box["width"] * (24 + 18) / 72 + 1, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * (24 + 21) / 72 - 1, y, steps=5)
    page.mouse.up()
    assert not page.locator("#book-picked").is_hidden()
    assert "small/5" in page.inner_text("#book-picked")
    start_value = page.input_value("#book-start")
    end_value = page.input_value("#book-end")
    # The browser context runs in UTC (the page fixture), so tomorrow is tomorrow's UTC date.
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert start_value.startswith(f"{tomorrow}T18:") and end_value.startswith(f"{tomorrow}T2"), (start_value, end_value)
    assert start_value < end_value
    page.click("#book-submit")
    page.wait_for_selector("#book-success:not([hidden])")
    r = Reservation.objects.get()
    assert [a.gpu.uuid for a in r.allocations.all()] == ["GPU-small-5"]
    row = page.locator(f'#my-reservations tr[data-reservation-id="{r.pk}"]')
    row.wait_for()
    row.locator("button[data-action=cancel]").click()
    page.wait_for_function(f"() => !document.querySelector('#my-reservations tr[data-reservation-id=\"{r.pk}\"]')")
    r.refresh_from_db()
    assert r.status in (ReservationStatus.CANCELLED, ReservationStatus.RELEASED)
    assert r.end - r.start <= timedelta(hours=3)


def test_a_gpu_the_teams_quota_excludes_is_refused_when_picked(page, live_portal, fleet, vision, h100):
    from apps.booking.models import Quota

    Quota.objects.create(team=vision, gpu_hours=None).allowed_models.set([h100])
    page.reload()  # the page lists each team's allowed models when it loads
    page.wait_for_selector(".tl-row[data-gpu-uuid]")
    page.select_option("#tl-days", "3")
    page.wait_for_selector('#timeline[data-days="3"]')  # redrawn for the new window before the drag

    def drag(uuid: str) -> None:
        box = page.locator(f'.tl-row[data-gpu-uuid="{uuid}"] .tl-track').bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * (24 + 18) / 72 + 1, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * (24 + 21) / 72 - 1, y, steps=5)
        page.mouse.up()

    drag("GPU-small-0")  # an A100: not for vision this month
    assert page.locator("#book-picked").is_hidden()
    assert "quota does not allow A100-80GB: pick a GPU of H100-80GB" in page.inner_text("#book-error")
    drag("GPU-small-5")  # an H100: taken, and the refusal is gone
    assert "small/5" in page.inner_text("#book-picked") and page.locator("#book-error").is_hidden()
    page.click("#book-submit")
    page.wait_for_selector("#book-success:not([hidden])")
    assert [a.gpu.uuid for a in Reservation.objects.get().allocations.all()] == ["GPU-small-5"]


def test_other_peoples_bookings_reach_the_open_page(page, fleet, vision, bob, charlie, nlp):
    page.wait_for_selector('#timeline[data-live="1"]')  # the page's /ws/bookings/ socket is in its group
    start, end = slot(days=1, hour=8, hours=2)
    # Another team's booking shows on the timeline (as theirs), without a reload.
    theirs = services.reservation_create(user=charlie, team=nlp, start=start, end=end, gpus=["GPU-big-3"]).reservation
    other = page.locator('.tl-row[data-gpu-uuid="GPU-big-3"] .tl-slot.other[data-team="nlp"]')
    other.wait_for()
    # A teammate's shows as the team's, and in the list of the team's bookings.
    ours = services.reservation_create(user=bob, team=vision, start=start, end=end, gpus=["GPU-big-4"]).reservation
    page.locator(f'.tl-slot.mine[data-reservation-id="{ours.pk}"]').wait_for()
    page.locator(f'#my-reservations tr[data-reservation-id="{ours.pk}"]').wait_for()
    # Cancelled by their holders: gone from the timeline and the list.
    services.reservation_end(user=charlie, reservation_id=theirs.pk)
    other.wait_for(state="detached")
    services.reservation_end(user=bob, reservation_id=ours.pk)
    # The list and the timeline reload side by side: wait for each.
    page.wait_for_function(f"() => !document.querySelector('#my-reservations tr[data-reservation-id=\"{ours.pk}\"]')")
    page.locator(f'.tl-slot[data-reservation-id="{ours.pk}"]').wait_for(state="detached")


def test_a_job_outside_a_reservation_reaches_the_open_timeline(page, fleet, vision, bob):
    """A teammate's job placed outside any reservation holds its GPU on the timeline from its start: the open page
    shows it without a reload."""
    from apps.jobs import services as jobs
    from apps.jobs.models import ContainerImage

    page.wait_for_selector('#timeline[data-live="1"]')
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    node = fleet["nodes"]["big"]
    node.token_digest = "d" * 64  # a registered agent, which the launch command goes to
    node.save(update_fields=["token_digest"])
    image = "portal-test/busybox:latest"
    job = jobs.job_submit(user=bob, team=vision, image=image, command=["true"], max_duration_s=7200)
    jobs.job_start(job=job, node=node, gpus=[fleet["gpus"]["big/6"]], now=timezone.now())
    page.locator(f'.tl-row[data-gpu-uuid="GPU-big-6"] .tl-slot.mine[data-job-id="{job.pk}"]').wait_for()


def test_the_reservation_page_follows_what_others_do_to_it(page, live_portal, fleet, vision, alice, bob):
    """Alice has the page of her teammate's reservation open; he moves its end, then cancels it: the page shows each
    change without her reloading it."""
    start, end = slot(days=1, hour=9, hours=2)
    r = services.reservation_create(user=bob, team=vision, start=start, end=end, gpus=["GPU-big-2"]).reservation
    page.goto(f"{live_portal.url}/book/reservations/{r.pk}/")
    page.wait_for_selector('#reservation-page[data-following="1"]')
    later = end + timedelta(hours=1)
    services.reservation_change_end(user=bob, reservation_id=r.pk, end=later)
    page.wait_for_function(
        "(t) => Date.parse(document.querySelector('#reservation-page').dataset.end) === t", arg=later.timestamp() * 1000
    )
    page.wait_for_selector('#reservation-page[data-following="1"]')  # the reloaded page's socket
    services.reservation_end(user=bob, reservation_id=r.pk)
    page.wait_for_selector("#res-status.status-cancelled")
    assert page.locator("#end-form").count() == 0  # nothing left to cancel
