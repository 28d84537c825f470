"""Asking for any MIG instance with at least N MiB (`mig_memory_mib`) instead of a profile: bookings and jobs get
the smallest profile that has that much memory and is free, a bigger one when it is not, 409 when none is, and
400 when no instance in the fleet has that much."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.booking.models import Allocation, QuotaHold, QuotaUsage
from apps.fleet.devices import MigInstance, mig_layout_apply
from apps.fleet.models import Gpu, GpuStatus
from apps.jobs import scheduler, services
from apps.jobs.models import ContainerImage, Job, JobState
from apps.jobs.scheduling import FAIR
from tests.booking.conftest import slot
from tests.factories import GpuFactory
from workers.gpu.mig import profiles_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def mixed(sharing_fleet: dict[str, Any]) -> dict[str, Any]:
    """A second A100-80GB in MIG mode on node "mig", laid out 2g.20gb + 3g.40gb (beside the seven 1g.10gb)."""
    mig = sharing_fleet["mig"]
    table = profiles_for("A100-80GB")
    gpu = GpuFactory(node=mig.node, index=2, model=mig.model, uuid="GPU-mig-2", mig_mode=True, status=GpuStatus.OK)
    layout = [
        MigInstance(uuid=f"MIG-mig-2-{gi}", profile=name, memory_mib=table[name].memory_mib, gi_id=gi)
        for gi, name in ((1, "2g.20gb"), (2, "3g.40gb"))
    ]
    mig_layout_apply(gpu=gpu, mig_mode=True, instances=layout)
    return sharing_fleet


def body(**extra: Any) -> dict[str, Any]:
    start, end = slot(hours=2)
    return {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}


def _profiles(resp: Any) -> list[str]:
    return [g["profile"] for g in resp.json()["gpus"]]


def test_a_booking_by_memory_takes_the_smallest_profile_that_is_free(api_as, alice, mixed):
    client = api_as(alice)
    small = client.post(URL, body(mig_memory_mib=9000), format="json")
    assert small.status_code == 201, small.json()
    assert _profiles(small) == ["1g.10gb"]

    assert _profiles(client.post(URL, body(mig_memory_mib=15000), format="json")) == ["2g.20gb"]
    # The only 2g.20gb is taken: the next smallest with that much memory.
    assert _profiles(client.post(URL, body(mig_memory_mib=15000), format="json")) == ["3g.40gb"]
    full = client.post(URL, body(mig_memory_mib=15000), format="json")
    assert full.status_code == 409 and full.json()["code"] == "conflict"
    assert "2g.20gb/3g.40gb" in full.json()["detail"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"mig_memory_mib": 100_000}, "mig_memory_mib"),  # more than any instance
        ({"mig_memory_mib": 0}, "mig_memory_mib"),
        ({"mig_memory_mib": "lots"}, "mig_memory_mib"),
        ({"mig_memory_mib": 9000, "mig_profile": "1g.10gb"}, "gpu_share"),
    ],
)
def test_bad_memory_requests_are_400(api_as, alice, mixed, extra, field):
    resp = api_as(alice).post(URL, body(**extra), format="json")
    assert resp.status_code == 400, resp.json()
    assert field in resp.json()["fields"]
    assert not Allocation.objects.exists()


def test_a_job_by_memory_runs_on_the_smallest_instance_free_and_counts_it(alice, vision, mixed, monkeypatch):
    from apps.fleet import commands

    monkeypatch.setattr(commands, "publish_command", lambda *a, **kw: None)
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    for gpu in Gpu.objects.all():
        gpu.node.token_digest = "d" * 64
        gpu.node.save(update_fields=["token_digest"])

    def submit(**fields: Any) -> Job:
        return services.job_submit(
            user=alice, team=vision, image="portal-test/busybox:latest", command=["true"], max_duration_s=600, **fields
        )

    job = submit(mig_memory_mib=30000)
    assert (job.mig_profile, job.mig_memory_mib) == ("", 30000)
    assert job.pk in scheduler.run_pass(token=1, leader="test", policy=FAIR).started
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.mig_profile == "3g.40gb"
    held = Allocation.objects.get(job_id=job.pk, active=True).gpu
    assert (held.kind, held.mig_profile, held.parent.uuid) == ("mig", "3g.40gb", "GPU-mig-2")
    # Its price is the instance's: 3/7 of the GPU's.
    assert job.hourly_price == (mixed["model"].hourly_price * held.capacity).quantize(job.hourly_price)
    # Its quota hold was the smallest profile with 30000 MiB; it got that one, so the hold stays as it was.
    assert QuotaHold.objects.get(job_id=job.pk).gpus == Decimal("0.428571")

    # With every 1g.10gb held, a job asking 9000 MiB (held as a 1g.10gb at submission) gets the 2g.20gb: its hold
    # grows from 1/7 to 2/7 of a GPU, as billing charges it.
    ones = [submit(mig_profile="1g.10gb") for _ in range(7)]
    assert set(scheduler.run_pass(token=2, leader="test", policy=FAIR).started) == {j.pk for j in ones}
    usage_before = _usage(vision)
    small = submit(mig_memory_mib=9000)
    assert QuotaHold.objects.get(job_id=small.pk).gpus == Decimal("0.142857")
    held_before = _usage(vision) - usage_before
    assert small.pk in scheduler.run_pass(token=3, leader="test", policy=FAIR).started
    small.refresh_from_db()
    assert small.mig_profile == "2g.20gb"
    hold = QuotaHold.objects.get(job_id=small.pk)
    assert hold.gpus == Decimal("0.285714")
    assert hold.hourly_rate == (mixed["model"].hourly_price * Decimal("0.285714")).quantize(Decimal("0.0001"))
    assert _usage(vision) - usage_before == pytest.approx(2 * held_before, rel=1e-3)
    # Nothing has 100 GB, and memory with a profile or a share is ambiguous: 400 at submission.
    from apps.core.errors import ValidationFailed

    for fields in ({"mig_memory_mib": 100_000}, {"mig_memory_mib": 9000, "gpu_share": 0.25}):
        with pytest.raises(ValidationFailed):
            submit(**fields)


def _usage(team: Any) -> float:
    """The team's GPU-hours held or used this month and next, all months added."""
    return float(sum(u.gpu_hours for u in QuotaUsage.objects.filter(team=team)))
