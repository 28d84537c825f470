"""Idle reclaim on parts of a GPU. A MIG instance's memory is rolled up per minute like a GPU's (taken only from the
GPU it belongs to); an instance that held no process is released as unused or reclaimed, one holding memory is
never judged (NVML gives no utilization per instance). A share is judged by its whole GPU: idle only while the GPU
is. What is handed back is counted at the part's share of the GPU and priced as billing prices it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.billing.models import MigProfilePrice
from apps.booking import services as booking
from apps.booking.models import ReservationStatus
from apps.efficiency import detector, services
from apps.efficiency.models import IdleMark, MarkState
from apps.fleet import services as fleet_services
from apps.fleet.messages import check_row
from apps.fleet.models import Gpu
from apps.jobs import services as jobs
from apps.jobs.models import JobReason
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.models import GpuRollup
from apps.telemetry.rollups import accumulator_instance_rows, flush_rollups
from tests.booking.conftest import slot
from tests.efficiency.conftest import write_minutes
from tests.fleet.util import row, telemetry

pytestmark = pytest.mark.django_db

FIRST, SECOND = "MIG-mig-0-7", "MIG-mig-0-8"  # two of the seven 1g.10gb instances of GPU-mig-0 (conftest)


def _ingest(node: str, token: str, rows: list[list[Any]], ts: float) -> None:
    assert telemetry_ingest(telemetry(node, token, rows, ts=ts), now=ts).accepted == len(rows)


def test_instance_memory_is_rolled_up_from_its_own_gpu_only(settings, sharing_fleet):
    minute = int(datetime.now(UTC).timestamp() // 60 * 60) - 120
    mig, shared = (fleet_services.node_token_issue(node_name=n)[1] for n in ("mig", "shared"))
    # FIRST's SM activity comes with its memory (GPM, Hopper and later); SECOND's does not.
    _ingest("mig", mig, [row("GPU-mig-0", mem=9_000, extra={"m": [[FIRST, 5_000, 30], [SECOND, 13]]})], minute + 1)
    _ingest("mig", mig, [row("GPU-mig-0", mem=9_000, extra={"m": [[FIRST, 6_000, 70]]})], minute + 2)
    # Node "shared" names GPU-mig-0's instance under its own GPU: ingest takes the row (its GPU), the flush
    # never gives the reading to an instance of another node's GPU.
    _ingest("shared", shared, [row("GPU-shared-0", extra={"m": [[FIRST, 9_500]]})], minute + 3)

    assert flush_rollups(now=minute + 60 + settings.TELEMETRY_MAX_AGE_S + 6) == 4  # two GPUs, two instances
    at = datetime.fromtimestamp(minute, tz=UTC)
    first = GpuRollup.objects.get(gpu__uuid=FIRST, minute=at)
    assert (first.samples, first.mem_used_max, first.mem_used_mean) == (2, 6_000, 5_500.0)
    assert (first.util_min, first.util_mean, first.util_max) == (30, 50.0, 70)
    assert (first.temp_max, first.power_mean) == (None, None)  # the GPU's, not the instance's
    second = GpuRollup.objects.get(gpu__uuid=SECOND, minute=at)
    assert (second.samples, second.mem_used_max, second.util_mean) == (1, 13, None)
    parent = GpuRollup.objects.get(gpu__uuid="GPU-mig-0", minute=at)
    assert (parent.samples, parent.util_mean, parent.mem_used_max) == (2, 50.0, 9_000)


def test_an_instances_sm_activity_travels_with_its_memory():
    parsed = check_row(
        row("GPU-x", extra={"m": [[FIRST, 5_000, 42], [SECOND, 13, 101], ["MIG-c", 7, True], ["MIG-d", 9, "5"]]})
    )
    assert parsed.mig_memory == {FIRST: 5_000, SECOND: 13, "MIG-c": 7, "MIG-d": 9}  # a bad % drops the % alone
    assert parsed.mig_util == {FIRST: 42}
    assert check_row(row("GPU-x", extra={"m": [[FIRST, 5_000, 42, 1]]})).mig_memory == {}


def test_instance_fields_are_read_apart_from_the_gpus():
    raw = {
        b"GPU-a|n": b"2",
        b"GPU-a|i_n:MIG-a-1": b"2",
        b"GPU-a|i_s:MIG-a-1": b"30",
        b"GPU-a|i_hi:MIG-a-1": b"20",
        b"GPU-a|i_hi:MIG-a-2": b"7",  # no count: not a reading
        b"GPU-a|i_x:MIG-a-3": b"1",
        b"GPU-a|i_n:": b"1",
        b"GPU-a|i_n:MIG-a-4": b"nan?",
    }
    rows = accumulator_instance_rows(raw)
    assert list(rows) == [("GPU-a", "MIG-a-1")]
    assert rows[("GPU-a", "MIG-a-1")]["mem_used_mean"] == 15.0 and rows[("GPU-a", "MIG-a-1")]["mem_used_max"] == 20


def test_an_instance_minute_is_empty_only_without_a_process():
    th = detector.Thresholds()
    assert detector.minute_kind(detector.instance_sample(13, 9_728), th) == detector.MinuteKind.EMPTY
    assert detector.minute_kind(detector.instance_sample(detector.NO_PROCESS_MIB, 9_728), th) == "held"
    assert detector.minute_kind(detector.instance_sample(300, 9_728), th) == detector.MinuteKind.HELD
    assert detector.minute_kind(detector.instance_sample(None, 9_728), th) == detector.MinuteKind.UNKNOWN
    empty, held = detector.Minute(0.0, detector.MinuteKind.EMPTY), detector.Minute(None, detector.MinuteKind.HELD)
    # A process for 5 of the first 30 minutes: used, so not released as unused, though 25 minutes are empty.
    assert detector.unused([empty] * 30, th) and not detector.unused([held] * 5 + [empty] * 25, th)
    # Held minutes count for nothing in the mean; the newest one held: no warning.
    assert detector.decide([empty] * 60, th, warned_for=None).action == detector.Action.WARN
    assert detector.decide([empty] * 59 + [held], th, warned_for=None).action == detector.Action.NONE
    assert detector.decide([empty] * 50 + [held] * 15 + [empty], th, warned_for=None).action == "none"  # too few known
    # After a warning, a process on the instance again clears it.
    assert detector.decide([empty] * 65 + [held], th, warned_for=6).action == detector.Action.CLEAR
    assert detector.combine([detector.instance_sample(12, 9_728), detector.instance_sample(900, 9_728)], th) == held


def _active(alice: Any, **part: Any) -> Any:
    start, end = slot(hours=4)
    r = booking.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, **part
    ).reservation
    booking.reservations_tick(now=start)
    r.refresh_from_db()
    assert r.status == ReservationStatus.ACTIVE
    return r


def _instance_minutes(gpu: Gpu, start: datetime, minutes: int, mem: int) -> None:
    GpuRollup.objects.bulk_create(
        [
            GpuRollup(gpu=gpu, minute=start + timedelta(minutes=i), samples=60, mem_used_mean=mem, mem_used_max=mem)
            for i in range(minutes)
        ]
    )


def _held(r: Any) -> Gpu:
    (gpu,) = [a.gpu for a in r.allocations.select_related("gpu")]
    return gpu


def test_an_unused_instance_is_released_and_priced_at_its_profile(alice, sharing_fleet):
    r = _active(alice, mig_profile="1g.10gb")
    instance = _held(r)
    assert instance.kind == "mig"
    _instance_minutes(instance, r.start, 31, mem=13)
    at = r.start + timedelta(minutes=31)
    assert services.idle_scan(now=at).unused == [f"reservations/{r.pk}"]
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED and r.released_reason == "unused"
    mark = IdleMark.objects.get(kind="reservation", source_id=r.pk)
    # 4 h booked, released after 31 min: 209 min of one seventh of an A100 at 2.80/h (0.40/h for the instance).
    assert mark.state == MarkState.UNUSED and mark.reclaimed_gpu_hours == Decimal("0.4976")
    assert mark.reclaimed_cost == Decimal("1.3933")


def test_an_instance_emptied_for_an_hour_is_reclaimed_at_the_admins_price(alice, sharing_fleet):
    MigProfilePrice.objects.create(gpu_model=sharing_fleet["model"], profile="1g.10gb", hourly_price=Decimal("0.60"))
    r = _active(alice, mig_profile="1g.10gb")
    instance = _held(r)
    _instance_minutes(instance, r.start, 10, mem=5_000)  # a model loaded: not unused, not judged
    _instance_minutes(instance, r.start + timedelta(minutes=10), 60, mem=12)  # then the process exited
    assert services.idle_scan(now=r.start + timedelta(minutes=70)).warned == [f"reservations/{r.pk}"]
    _instance_minutes(instance, r.start + timedelta(minutes=70), 16, mem=12)
    at = r.start + timedelta(minutes=86)
    assert services.idle_scan(now=at).reclaimed == [f"reservations/{r.pk}"]
    mark = IdleMark.objects.get(kind="reservation", source_id=r.pk)
    # 154 min left of one seventh of a GPU, at the admins' 0.60/h for the profile.
    assert (mark.reclaimed_gpu_hours, mark.reclaimed_cost) == (Decimal("0.3667"), Decimal("1.5400"))


def test_an_instance_holding_memory_is_never_judged(alice, sharing_fleet):
    r = _active(alice, mig_profile="1g.10gb")
    _instance_minutes(_held(r), r.start, 200, mem=2_000)  # idle or busy: NVML cannot tell
    result = services.idle_scan(now=r.start + timedelta(minutes=200))
    assert (result.warned, result.unused, result.reclaimed) == ([], [], [])
    assert not IdleMark.objects.filter(source_id=r.pk).exists()


def test_an_instance_with_sm_activity_is_judged_as_a_gpu(alice, sharing_fleet):
    """Where GPM gives an instance's SM activity, a process that holds memory but computes nothing is idle (loaded:
    the longer window), and one that computes is busy."""
    r = _active(alice, mig_profile="1g.10gb")
    instance = _held(r)
    write_minutes(instance, r.start, 10, util=60, mem=6_000)
    write_minutes(instance, r.start + timedelta(minutes=10), 110, util=1, mem=6_000)  # a notebook left open
    assert services.idle_scan(now=r.start + timedelta(minutes=120)).warned == []  # loaded: 120 min, not yet
    write_minutes(instance, r.start + timedelta(minutes=120), 10, util=0, mem=6_000)
    assert services.idle_scan(now=r.start + timedelta(minutes=130)).warned == [f"reservations/{r.pk}"]
    assert IdleMark.objects.get(kind="reservation", source_id=r.pk).loaded
    write_minutes(instance, r.start + timedelta(minutes=130), 2, util=80, mem=6_000)  # back at work
    assert services.idle_scan(now=r.start + timedelta(minutes=132)).cleared == [f"reservations/{r.pk}"]


def test_a_process_back_on_the_instance_clears_the_warning(alice, sharing_fleet):
    r = _active(alice, mig_profile="1g.10gb")
    instance = _held(r)
    _instance_minutes(instance, r.start, 5, mem=3_000)
    _instance_minutes(instance, r.start + timedelta(minutes=5), 60, mem=12)
    assert services.idle_scan(now=r.start + timedelta(minutes=65)).warned == [f"reservations/{r.pk}"]
    _instance_minutes(instance, r.start + timedelta(minutes=65), 3, mem=4_000)
    assert services.idle_scan(now=r.start + timedelta(minutes=68)).cleared == [f"reservations/{r.pk}"]
    r.refresh_from_db()
    assert r.status == ReservationStatus.ACTIVE


def test_a_share_is_idle_only_while_its_whole_gpu_is(alice, bob, sharing_fleet):
    shared = sharing_fleet["shared"]
    mine = _active(alice, gpu_share=0.25)
    theirs = _active(bob, gpu_share=0.5)
    assert {a.gpu.parent_id for r in (mine, theirs) for a in r.allocations.select_related("gpu")} == {shared.pk}
    write_minutes(shared, mine.start, 10, util=80, mem=30_000)
    # Bob's work keeps the GPU busy for an hour: neither share is idle, though alice may be doing nothing.
    write_minutes(shared, mine.start + timedelta(minutes=10), 60, util=60, mem=20_000)
    assert services.idle_scan(now=mine.start + timedelta(minutes=70)).warned == []
    # Then the whole GPU is idle with nothing loaded: both holders are warned, and reclaimed after the grace.
    write_minutes(shared, mine.start + timedelta(minutes=70), 60, util=0, mem=0)
    warned = services.idle_scan(now=mine.start + timedelta(minutes=130)).warned
    assert sorted(warned) == sorted([f"reservations/{mine.pk}", f"reservations/{theirs.pk}"])
    # Bob's half is two share rows of one GPU: one GPU, as his booking counts it.
    assert IdleMark.objects.get(kind="reservation", source_id=theirs.pk).gpu_count == 1
    write_minutes(shared, mine.start + timedelta(minutes=130), 16, util=0, mem=0)
    at = mine.start + timedelta(minutes=146)
    assert len(services.idle_scan(now=at).reclaimed) == 2
    mark = IdleMark.objects.get(kind="reservation", source_id=mine.pk)
    # 94 min left of a quarter of an A100 at 2.80/h.
    assert (mark.reclaimed_gpu_hours, mark.reclaimed_cost) == (Decimal("0.3917"), Decimal("1.0967"))
    assert IdleMark.objects.get(kind="reservation", source_id=theirs.pk).reclaimed_gpu_hours == Decimal("0.7833")


def test_a_job_whose_process_left_its_instance_is_stopped(alice, vision, ready):
    instance = Gpu.devices.get(uuid=FIRST)
    job = jobs.job_submit(
        user=alice,
        team=vision,
        image="portal-test/busybox:latest",
        command=["sleep", "1d"],
        max_duration_s=6 * 3600,
        mig_profile="1g.10gb",
    )
    job = jobs.job_transition(
        jobs.job_start(job=job, node=instance.node, gpus=[instance], now=timezone.now()), "running"
    )
    start = job.started_at.replace(second=0, microsecond=0)
    _instance_minutes(instance, start, 20, mem=6_000)  # working (or not: held, never judged)
    assert services.idle_scan(now=start + timedelta(minutes=20)).warned == []
    _instance_minutes(instance, start + timedelta(minutes=20), 60, mem=14)  # its process is gone, the job lingers
    assert services.idle_scan(now=start + timedelta(minutes=80)).warned == [f"jobs/{job.pk}"]
    _instance_minutes(instance, start + timedelta(minutes=80), 16, mem=14)
    assert services.idle_scan(now=start + timedelta(minutes=96)).reclaimed == [f"jobs/{job.pk}"]
    job.refresh_from_db()
    assert job.stop_reason == JobReason.IDLE
    mark = IdleMark.objects.get(kind="job", source_id=job.pk)
    # What was left of its 6 hours, on one seventh of a GPU.
    left = (job.started_at + timedelta(hours=6) - (start + timedelta(minutes=96))).total_seconds() / 3600
    assert abs(float(mark.reclaimed_gpu_hours) - left / 7) < 0.001


def _share_job(alice: Any, vision: Any, share: Gpu) -> Any:
    job = jobs.job_submit(
        user=alice, team=vision, image="portal-test/busybox:latest", command=["sleep", "1d"],
        max_duration_s=6 * 3600, gpu_share=0.25,
    )  # fmt: skip
    return jobs.job_transition(jobs.job_start(job=job, node=share.node, gpus=[share], now=timezone.now()), "running")


def test_a_share_job_that_computes_nothing_is_idle_beside_a_busy_neighbour(alice, vision, ready, sharing_fleet):
    """Where the node reads each job's own SM activity (per-process utilization), a job on a share is judged by
    it: the one holding a model and computing nothing is warned and reclaimed while its neighbour keeps the GPU
    busy; the busy one is never warned. Minutes without the job's own reading fall back to the GPU's."""
    from apps.telemetry.models import JobMemoryMinute

    shared = sharing_fleet["shared"]
    first, second = Gpu.devices.filter(parent=shared).order_by("index")[:2]
    idle, busy = _share_job(alice, vision, first), _share_job(alice, vision, second)
    start = max(idle.started_at, busy.started_at).replace(second=0, microsecond=0)

    def minutes(offset: int, count: int, idle_util: float | None) -> None:
        write_minutes(shared, start + timedelta(minutes=offset), count, util=85, mem=40_000)
        JobMemoryMinute.objects.bulk_create(
            [JobMemoryMinute(job=j, gpu=shared, minute=start + timedelta(minutes=offset + i), mem_used_max=mem,
                             util_mean=util) for i in range(count)
             for j, mem, util in ((idle, 12_000, idle_util), (busy, 20_000, 85.0))]
        )  # fmt: skip

    minutes(0, 130, None)  # the node cannot read per-process utilization: the GPU's minutes, busy
    assert services.idle_scan(now=start + timedelta(minutes=130)).warned == []
    minutes(130, 121, 0.0)  # a model loaded (12 GiB of its 20 GiB), no kernel: the loaded window, then warned
    scan = services.idle_scan(now=start + timedelta(minutes=251))
    assert scan.warned == [f"jobs/{idle.pk}"]
    minutes(251, 16, 0.0)
    assert services.idle_scan(now=start + timedelta(minutes=267)).reclaimed == [f"jobs/{idle.pk}"]
    assert not IdleMark.objects.filter(kind="job", source_id=busy.pk).exists()
