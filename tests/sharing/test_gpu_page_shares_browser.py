"""The GPU page in headless Chromium: an admin splits a GPU in shares with the page's control and sees its shares;
a change refused because a share is booked shows the reason on the page; members get no control."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from apps.booking.services import allocations_create
from apps.fleet.models import Gpu
from tests.booking.conftest import slot
from tests.booking.test_book_page_browser import CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def signed_in(live_portal: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Any]]:
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed (make system-deps)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)

        def sign_in(username: str) -> Any:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{live_portal.url}/accounts/login/")
            page.fill("input[name=username]", username)
            page.fill("input[name=password]", "pw-for-tests")
            page.click("button[type=submit]")
            page.wait_for_url(f"{live_portal.url}/")
            return page

        try:
            yield sign_in
            assert not errors, errors
        finally:
            browser.close()
            connections.close_all()


def test_an_admin_splits_a_gpu_on_its_page(signed_in, live_portal, admin, alice, vision, sharing_fleet):
    page = signed_in("admin")
    page.goto(f"{live_portal.url}/fleet/gpus/GPU-shared-1/")
    assert page.locator("#gpu-parts").count() == 0
    page.select_option("#shares-count", "4")
    page.click("#shares-form button[type=submit]")
    page.wait_for_selector("#gpu-parts tbody tr")
    assert page.locator("#gpu-parts tbody tr").count() == 4
    assert page.locator("#shares-count").input_value() == "4"
    assert Gpu.objects.get(uuid="GPU-shared-1").shares == 4

    start, end = slot(hours=2)
    share = Gpu.devices.filter(parent__uuid="GPU-shared-1", retired_at__isnull=True).order_by("index").first()
    allocations_create(gpus=[share], team=vision, user=alice, start=start, end=end, kind="job", job_id=7)
    page.select_option("#shares-count", "1")
    page.click("#shares-form button[type=submit]")
    message = page.locator("#shares-msg.form-error")
    message.wait_for()
    assert "held now or later" in message.inner_text()
    assert page.locator("#shares-form button[type=submit]").is_enabled()
    assert Gpu.objects.get(uuid="GPU-shared-1").shares == 4


def test_members_get_no_control(signed_in, live_portal, alice, sharing_fleet):
    page = signed_in("alice")
    page.goto(f"{live_portal.url}/fleet/gpus/GPU-shared-1/")
    page.wait_for_selector("#gpu-status")
    assert page.locator("#shares-form").count() == 0


def test_a_mig_gpu_page_draws_each_instances_memory(signed_in, live_portal, alice, sharing_fleet):
    from datetime import timedelta

    from django.utils import timezone

    from apps.telemetry.models import GpuRollup

    now = timezone.now().replace(second=0, microsecond=0)
    instances = list(Gpu.devices.filter(parent__uuid="GPU-mig-0", kind="mig").order_by("gi_id")[:2])
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu=g, minute=now - timedelta(minutes=m), samples=60, mem_used_mean=900.0 * k, mem_used_max=1000 * k)
        for k, g in enumerate(instances, start=1)
        for m in range(1, 21)
    )
    page = signed_in("alice")
    page.goto(f"{live_portal.url}/fleet/gpus/GPU-mig-0/")
    page.wait_for_function("() => document.body.dataset.instanceLines !== undefined")
    assert page.evaluate("document.body.dataset.instanceLines") == "2"
    assert page.inner_text("#instances-note") == "2 of 7 instances with readings in this range"
    page.click('.gpu-ranges button[data-resolution="raw"]')
    page.wait_for_function("() => document.body.dataset.instanceLines === '0'")
    assert "pick 1 h or more" in page.inner_text("#instances-note")
    page.goto(f"{live_portal.url}/fleet/gpus/GPU-shared-0/")  # not in MIG mode: no such chart
    page.wait_for_function("() => document.body.dataset.historyPoints !== undefined")
    assert page.locator("#chart-instances").count() == 0


def test_a_shared_gpu_page_shows_each_held_shares_job_activity(signed_in, live_portal, alice, vision, ready, sent):
    """Each held share's row shows what its job uses and, where its node reads per-process utilization, the % of
    the GPU's SMs the job keeps busy: the one that computes and the one that only holds memory are told apart."""
    from apps.telemetry.publisher import FleetPublisher
    from tests.sharing.test_job_memory import _report, _started

    busy, idle = _started(alice, vision, gpu_share=0.25), _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[busy.pk, 8_192, 70], [idle.pk, 3_072, 0]])
    FleetPublisher().publish_once()
    shares = {job.pk: Gpu.devices.get(jobs=job).uuid for job in (busy, idle)}
    page = signed_in("alice")
    page.goto(f"{live_portal.url}/fleet/gpus/GPU-shared-0/")
    row = f'#gpu-parts tr[data-part="{shares[busy.pk]}"] .part-used-text'
    page.wait_for_function(f"() => document.querySelector('{row}').textContent !== '—'")
    assert page.inner_text(row) == "8.0 / 20.0 GiB · SM 70%"
    other = f'#gpu-parts tr[data-part="{shares[idle.pk]}"] .part-used-text'
    assert page.inner_text(other) == "3.0 / 20.0 GiB · SM 0%"
