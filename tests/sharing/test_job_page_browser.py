"""A job on a MIG instance or a share, on its page in headless Chromium: the device it holds is listed with its GPU,
the GPU's live utilization and, for an instance, the instance's own memory; the memory panel shows the job's own
peak against its part."""

from __future__ import annotations

import shutil
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.fleet import services as fleet_services
from apps.fleet.models import Gpu
from apps.jobs.models import Job, JobState
from apps.telemetry.ingest import telemetry_ingest
from tests.browser.test_pages import signed_in
from tests.fleet.util import row, telemetry

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]


def _running(alice: Any, vision: Any, device: Gpu, **fields: Any) -> Job:
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["python", "serve.py"], gpu_count=1, cpus=Decimal(1),
        memory_mib=1024, max_duration_s=3600, state=JobState.RUNNING, node=device.node,
        started_at=timezone.now(), **fields,
    )  # fmt: skip
    job.gpus.set([device])
    return job


def test_a_part_job_page_shows_its_device_and_memory(
    live_portal: Any, alice: Any, vision: Any, sharing_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = Gpu.devices.filter(parent__uuid="GPU-mig-0").order_by("index").first()
    share = Gpu.devices.filter(parent__uuid="GPU-shared-0").order_by("index").first()
    assert instance is not None and share is not None
    on_instance = _running(alice, vision, instance, mig_profile="1g.10gb")
    on_share = _running(alice, vision, share, gpu_share=Decimal("0.25"))
    for node, uuid, used, extra in (
        ("mig", "GPU-mig-0", 7_000, {"m": [[instance.uuid, 5_120]], "j": [[on_instance.pk, 5_120]]}),
        ("shared", "GPU-shared-0", 30_000, {"j": [[on_share.pk, 19_500]]}),
    ):
        _, token = fleet_services.node_token_issue(node_name=node)
        assert telemetry_ingest(telemetry(node, token, [row(uuid, util=63, mem=used, extra=extra)])).accepted == 1

    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/{on_instance.pk}/")
        part = page.locator(f'#job-gpus tr[data-part="{instance.uuid}"]')
        assert part.locator("td").first.inner_text() == "mig/0 · 1g.10gb"
        page.wait_for_function("() => document.querySelector('#job-gpus tr[data-part] .util').textContent !== '—'")
        assert part.locator(".util").inner_text() == "63%"  # its GPU's: NVML has no utilization per instance
        assert part.locator(".mem").inner_text() == "5.0 GiB"  # the instance's own, not the GPU's 7,000 MiB
        assert page.inner_text("#job-mem-peak") == "5120 MiB"

    # A page of its own: leaving a running job's page aborts its log stream, which the page fixture counts as a
    # failed request.
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/{on_share.pk}/")
        part = page.locator(f'#job-gpus tr[data-part="{share.uuid}"]')
        assert part.locator("td").first.inner_text() == "shared/0 · share 1/4"
        page.wait_for_function("() => document.querySelector('#job-gpus tr[data-part] .util').textContent !== '—'")
        assert part.locator(".util").inner_text() == "63%"
        assert part.locator(".mem").inner_text() == "—"  # the GPU's 30,000 MiB are its neighbours' too
        assert page.inner_text("#job-mem-peak") == "19500 MiB"
        assert "of 20480 MiB" in page.inner_text("#job-efficiency")
        assert "the utilization is the whole GPU's" in page.inner_text("#job-part-note")


def test_a_share_job_submitted_from_the_form(
    live_portal: Any, alice: Any, vision: Any, sharing_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.jobs.models import ContainerImage

    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/new/")
        page.select_option("#id_team", "vision")
        page.fill("#id_command", "python\nserve.py")
        page.select_option("#id_part", "share:0.25")
        page.click("#job-form button[type=submit]")
        page.wait_for_url(f"{live_portal.url}/jobs/*/")
        assert "0.25 of one GPU: shared, no memory isolation" in page.inner_text("main")
    job = Job.objects.get()
    assert job.gpu_share == Decimal("0.25") and job.command == ["python", "serve.py"]


def test_the_form_keeps_the_model_and_the_part_consistent(
    live_portal: Any, alice: Any, vision: Any, sharing_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A100-80GB gives 1g.10gb instances and quarters; an H100-80GB added here gives neither. Choosing H100 sets a
    quarter back to whole GPUs; choosing 1g.10gb while H100 is chosen picks the A100; "any model" takes any part."""
    from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

    GpuFactory(node=NodeFactory(name="plain"), index=0, model=GpuModelFactory(name="H100-80GB"), uuid="GPU-h100-0")
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/new/")
        assert page.get_attribute('#id_part option[value="share:0.25"]', "title") == "on A100-80GB"
        page.select_option("#id_part", "share:0.25")
        assert page.input_value("#id_gpu_model") == ""  # any model: left alone
        page.select_option("#id_gpu_model", "H100-80GB")
        assert page.input_value("#id_part") == ""  # H100 has no shares: whole GPUs
        page.select_option("#id_part", "mig:1g.10gb")
        assert page.input_value("#id_gpu_model") == "A100-80GB"
        page.select_option("#id_gpu_model", "A100-80GB")
        assert page.input_value("#id_part") == "mig:1g.10gb"


def test_a_share_reservation_page_shows_what_its_own_processes_use(
    live_portal: Any, alice: Any, vision: Any, sharing_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's 30,000 MiB are every holder's together; the reservation's own 5,000 MiB (the agent's reading of the
    processes of no job, the GPU's only reservation) is what its row shows, beside its GPU's utilization."""
    from datetime import timedelta

    from apps.booking.services import reservation_create

    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    booked = reservation_create(user=alice, team=vision, start=start, end=start + timedelta(hours=1), gpu_share="0.25")
    (device,) = [a.gpu for a in booked.reservation.allocations.select_related("gpu")]
    other = Gpu.devices.filter(parent__uuid="GPU-shared-0").exclude(pk=device.pk).first()
    neighbour = _running(alice, vision, other, gpu_share=Decimal("0.25"))
    _, token = fleet_services.node_token_issue(node_name="shared")
    extra = {"j": [[neighbour.pk, 9_000, 80]], "o": [5_000, 30]}
    sample = row("GPU-shared-0", util=63, mem=30_000, extra=extra)
    assert telemetry_ingest(telemetry("shared", token, [sample])).accepted == 1

    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/book/reservations/{booked.reservation.pk}/")
        cells = page.locator(f'#res-devices tr[data-uuid="{device.uuid}"]')
        page.wait_for_function("() => document.querySelector('#res-devices tr[data-uuid] .mem').textContent !== '—'")
        assert cells.locator(".mem").inner_text() == "4.9 GiB"  # its own 5,000 MiB, not the GPU's 30,000
        assert cells.locator(".util").inner_text() == "63%"
        assert "no memory isolation" in cells.inner_text()
