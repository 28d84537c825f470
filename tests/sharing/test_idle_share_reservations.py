"""Idle reclaim of a reservation of shares by its own work: where it is the only reservation on its GPU, what no
job's processes use there (the agent's `"o"`, kept per minute as GpuRollup.others_*) is its holder's. From the
agent's row through ingest and the minute flush, then the idle scan beside a busy neighbour's job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import ReservationStatus
from apps.efficiency import services
from apps.fleet import services as fleet_services
from apps.fleet.messages import check_row
from apps.fleet.models import Gpu
from apps.jobs import services as jobs
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.models import GpuRollup, JobMemoryMinute
from apps.telemetry.rollups import flush_rollups
from tests.efficiency.conftest import write_minutes
from tests.fleet.util import row, telemetry
from tests.sharing.test_idle_parts import _active

pytestmark = pytest.mark.django_db


def _others(gpu: Gpu, start: datetime, minutes: int, *, util: float, mem: int) -> None:
    GpuRollup.objects.filter(gpu=gpu, minute__gte=start, minute__lt=start + timedelta(minutes=minutes)).update(
        others_util_mean=util, others_mem_max=mem
    )


def _neighbour_job(alice: Any, vision: Any, shared: Gpu, taken: set[int]) -> Any:
    share = Gpu.devices.filter(parent=shared).exclude(pk__in=taken).order_by("index").first()
    assert share is not None
    job = jobs.job_submit(
        user=alice, team=vision, image="portal-test/busybox:latest", command=["sleep", "1d"],
        max_duration_s=6 * 3600, gpu_share=0.25,
    )  # fmt: skip
    return jobs.job_transition(jobs.job_start(job=job, node=shared.node, gpus=[share], now=timezone.now()), "running")


def test_the_row_carries_what_no_jobs_processes_use(settings, sharing_fleet):
    parsed = check_row(row("GPU-x", extra={"o": [5_000, 40]}))
    assert (parsed.others_mem, parsed.others_util) == (5_000, 40)
    assert check_row(row("GPU-x", extra={"o": [5_000]})).others_util is None
    assert check_row(row("GPU-x", extra={"o": [5_000, 101]})).others_util is None  # a bad % drops the % alone
    for bad in ([-1], [True], ["5"], [1, 2, 3], 7, [10**9]):
        parsed = check_row(row("GPU-x", mem_total=81_920, extra={"o": bad}))
        assert (parsed.others_mem, parsed.others_util) == (None, None)
    # Through ingest into the minute's rollup of the GPU.
    minute = int(datetime.now(UTC).timestamp() // 60 * 60) - 120
    settings.TELEMETRY_MAX_AGE_S = 300
    _, token = fleet_services.node_token_issue(node_name="shared")
    for offset, others in ((5, [3_000, 10]), (25, [4_000, 30]), (45, [2_000])):
        message = telemetry("shared", token, [row("GPU-shared-0", mem=30_000, extra={"o": others})], ts=minute + offset)
        assert telemetry_ingest(message, now=minute + offset).accepted == 1
    flush_rollups(now=minute + 60 + 300 + 6)
    rollup = GpuRollup.objects.get(gpu__uuid="GPU-shared-0", minute=datetime.fromtimestamp(minute, tz=UTC))
    assert (rollup.others_mem_max, rollup.others_util_mean) == (4_000, 20.0)
    assert not JobMemoryMinute.objects.exists()  # "others" is no job's


def test_a_reservation_alone_on_its_gpu_is_idle_by_its_own_work_beside_a_busy_job(alice, vision, ready, sharing_fleet):
    shared = sharing_fleet["shared"]
    mine = _active(alice, gpu_share=0.25)
    taken = set(mine.allocations.values_list("gpu_id", flat=True))
    _neighbour_job(alice, vision, shared, taken)
    start = mine.start
    # The neighbour's job keeps the GPU at 85% for an hour; the holder's notebook computes now and then.
    write_minutes(shared, start, 60, util=85, mem=30_000)
    _others(shared, start, 60, util=12, mem=6_000)
    assert services.idle_scan(now=start + timedelta(minutes=60)).warned == []
    # Then the holder's processes stop computing, a model still loaded: the loaded window (twice as long), while
    # the GPU stays busy. Judged by the GPU, it never would be.
    write_minutes(shared, start + timedelta(minutes=60), 120, util=85, mem=30_000)
    _others(shared, start + timedelta(minutes=60), 120, util=0, mem=6_000)
    assert services.idle_scan(now=start + timedelta(minutes=120)).warned == []  # the window is not all idle yet
    assert services.idle_scan(now=start + timedelta(minutes=180)).warned == [f"reservations/{mine.pk}"]
    write_minutes(shared, start + timedelta(minutes=180), 16, util=85, mem=30_000)
    _others(shared, start + timedelta(minutes=180), 16, util=0, mem=6_000)
    assert services.idle_scan(now=start + timedelta(minutes=196)).reclaimed == [f"reservations/{mine.pk}"]
    mine.refresh_from_db()
    assert mine.status != ReservationStatus.ACTIVE


def test_a_reservation_running_a_job_inside_it_is_busy_by_that_job(alice, vision, ready, sharing_fleet):
    shared = sharing_fleet["shared"]
    mine = _active(alice, gpu_share=0.25)
    (share,) = [a.gpu for a in mine.allocations.select_related("gpu")]
    inner = jobs.job_submit(
        user=alice, team=vision, image="portal-test/busybox:latest", command=["sleep", "1d"],
        max_duration_s=3600, reservation_id=mine.pk,
    )  # fmt: skip
    inner = jobs.job_transition(
        jobs.job_start(job=inner, node=shared.node, gpus=[share], now=timezone.now()), "running"
    )
    start = mine.start
    write_minutes(shared, start, 130, util=70, mem=20_000)
    _others(shared, start, 130, util=0, mem=0)  # nothing outside jobs: the work is the inner job's
    JobMemoryMinute.objects.bulk_create(
        [JobMemoryMinute(job=inner, gpu=shared, minute=start + timedelta(minutes=i), mem_used_max=9_000, util_mean=70.0)
         for i in range(130)]
    )  # fmt: skip
    assert services.idle_scan(now=start + timedelta(minutes=130)).warned == []


def test_two_reservations_on_one_gpu_are_judged_by_the_gpu(alice, bob, sharing_fleet):
    """Whose processes are whose cannot be told between two reservations: both keep the GPU's minutes."""
    shared = sharing_fleet["shared"]
    mine, theirs = _active(alice, gpu_share=0.25), _active(bob, gpu_share=0.25)
    write_minutes(shared, mine.start, 130, util=80, mem=30_000)
    _others(shared, mine.start, 130, util=0, mem=0)
    assert services.idle_scan(now=mine.start + timedelta(minutes=130)).warned == []
    assert {mine.status, theirs.status} == {ReservationStatus.ACTIVE}
