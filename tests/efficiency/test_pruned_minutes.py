"""A job's figures outlive the minute rollups: once the prune has deleted a job's minutes
(TELEMETRY_MINUTE_RETENTION_DAYS, 14 days), its page, the job API and its month's efficiency report read the hourly
rollups instead of going blank."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.fleet.models import GpuStatus
from apps.jobs.models import Job, JobState
from apps.telemetry.models import GpuHourlyRollup, GpuRollup
from apps.telemetry.rollups import prune, rollup_hour
from apps.telemetry.selectors import gpu_readings, minutes_kept_from
from tests.efficiency.conftest import write_minutes
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _hours_rolled_up(start: datetime, hours: int) -> None:
    for h in range(hours):
        rollup_hour(hour=start + timedelta(hours=h))


@pytest.fixture
def old_job(alice: Any, vision: Any, settings: Any) -> Job:
    """A job 20 days ago, 90 minutes on one A100-80GB at 60% and up to half its memory; its minutes rolled up into
    hours by the real rollup, then pruned by the real prune."""
    settings.TELEMETRY_MINUTE_RETENTION_DAYS = 14
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.0"))
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, model=model, uuid="GPU-old-0", status=GpuStatus.OK)
    started = (timezone.now() - timedelta(days=20)).replace(minute=15, second=0, microsecond=0)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=7200, state=JobState.SUCCEEDED, started_at=started, ended_at=started + timedelta(minutes=90),
    )  # fmt: skip
    job.gpus.set([gpu])
    write_minutes(gpu, started, 45, util=60, mem=20480)
    write_minutes(gpu, started + timedelta(minutes=45), 45, util=60, mem=40960)
    _hours_rolled_up(started.replace(minute=0), 3)
    UsageRecord.objects.create(
        team=vision, user=alice, gpu=gpu, gpu_model=model, source="job", source_id=job.pk, start=started,
        end=job.ended_at, day=started.date(), month=timezone.localtime(started).date().replace(day=1),
        gpu_seconds=5400, hourly_price=Decimal("2.0"), cost=Decimal(3), mean_utilization=Decimal("0.6"),
    )  # fmt: skip
    assert prune()[0] == 90 and not GpuRollup.objects.exists()
    assert GpuHourlyRollup.objects.count() == 2
    return job


def test_the_job_api_reads_the_hours_once_the_minutes_are_gone(api_as, alice, old_job):
    body = api_as(alice).get(f"/api/v1/jobs/{old_job.pk}/").json()
    assert body["gpu_memory_peak_mib"] == 40960
    assert body["gpu_utilization_mean"] == 60.0


def test_the_months_report_keeps_the_jobs_memory_figure(api_as, alice, old_job):
    month = timezone.localtime(old_job.started_at).strftime("%Y-%m")
    body = api_as(alice).get("/api/v1/reports/efficiency/", {"team": "vision", "month": month}).json()
    [team] = body["teams"]
    assert (team["memory_peak_pct"], team["jobs_measured"]) == ("50.0", 1)


def test_readings_take_hours_before_the_kept_minutes_and_minutes_after(alice):
    """A window across the boundary: the hours before it from the hourly rows, every minute from it on, and no
    period counted twice (a minute row the prune has not reached yet is left to its hour)."""
    gpu = GpuFactory(uuid="GPU-edge-0")
    now = datetime(2026, 12, 20, 12, 30, tzinfo=UTC)
    split = minutes_kept_from(now)
    assert split == datetime(2026, 12, 6, 13, tzinfo=UTC)  # 14 days back, the next whole hour
    for h in (2, 1):
        GpuHourlyRollup.objects.create(gpu=gpu, hour=split - timedelta(hours=h), samples=3600, util_mean=10 * h,
                                       mem_used_max=1000 * h)  # fmt: skip
    GpuHourlyRollup.objects.create(gpu=gpu, hour=split, samples=60, util_mean=99.0, mem_used_max=99)  # has minutes
    write_minutes(gpu, split - timedelta(minutes=1), 3, util=50, mem=500)  # one minute before the split
    rows = gpu_readings(
        gpu_ids=[gpu.pk], start=split - timedelta(minutes=100), end=split + timedelta(minutes=1), now=now
    )
    assert [(t - split, util, mem) for _, t, util, mem in rows] == [
        (timedelta(hours=-2), 20.0, 2000),
        (timedelta(hours=-1), 10.0, 1000),
        (timedelta(0), 50.0, 500),
        (timedelta(minutes=1), 50.0, 500),
    ]
    # Wholly after the split: minutes only; wholly before: hours only.
    assert len(gpu_readings(gpu_ids=[gpu.pk], start=split, end=split + timedelta(hours=1), now=now)) == 2
    assert [
        t
        for _, t, *_ in gpu_readings(
            gpu_ids=[gpu.pk], start=split - timedelta(hours=2), end=split - timedelta(minutes=30), now=now
        )
    ] == [
        split - timedelta(hours=2),
        split - timedelta(hours=1),
    ]


def test_hours_are_utc_hours_where_local_hours_are_not(api_as, alice, vision, settings):
    """In India an hour starts at :30 UTC: a job from 10:40 to 10:55 UTC is in the hourly row of 10:00 UTC, which a
    local-hour truncation (10:30 UTC) would skip."""
    settings.TIME_ZONE = "Asia/Kolkata"
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.0"))
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, model=model, uuid="GPU-ist-0", status=GpuStatus.OK)
    started = (timezone.now() - timedelta(days=20)).astimezone(UTC).replace(hour=10, minute=40, second=0, microsecond=0)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=7200, state=JobState.SUCCEEDED, started_at=started, ended_at=started + timedelta(minutes=15),
    )  # fmt: skip
    job.gpus.set([gpu])
    GpuHourlyRollup.objects.create(gpu=gpu, hour=started.replace(minute=0), samples=900, util_mean=80.0,
                                   mem_used_max=20480)  # fmt: skip
    day = timezone.localtime(started).date()
    UsageRecord.objects.create(
        team=vision, user=alice, gpu=gpu, gpu_model=model, source="job", source_id=job.pk, start=started,
        end=job.ended_at, day=day, month=day.replace(day=1), gpu_seconds=900, hourly_price=Decimal("2.0"),
        cost=Decimal("0.5"), mean_utilization=Decimal("0.8"),
    )  # fmt: skip
    assert api_as(alice).get(f"/api/v1/jobs/{job.pk}/").json()["gpu_memory_peak_mib"] == 20480
    month = timezone.localtime(started).strftime("%Y-%m")
    body = api_as(alice).get("/api/v1/reports/efficiency/", {"team": "vision", "month": month}).json()
    [team] = body["teams"]
    assert (team["memory_peak_pct"], team["jobs_measured"]) == ("25.0", 1)


def test_the_reports_job_rows_read_no_logs(api_as, alice, old_job):
    """A row of "Most idle" shows the job's memory figures, not its advice: reading each job's 2,000-line log tail
    for it made the admin's report of a big month twice as slow (bench/efficiency_report.py --log-lines)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.jobs.models import JobLogLine

    JobLogLine.objects.bulk_create(
        [JobLogLine(job=old_job, seq=i, at=old_job.started_at, line="torch.OutOfMemoryError") for i in range(3)]
    )
    month = timezone.localtime(old_job.started_at).strftime("%Y-%m")
    with CaptureQueriesContext(connection) as queries:
        body = api_as(alice).get("/api/v1/reports/efficiency/", {"team": "vision", "month": month}).json()
    [team] = body["teams"]
    [row] = team["worst"]
    assert (row["id"], row["memory_peak_mib"], row["memory_allocated_mib"]) == (old_job.pk, 40960, 81920)
    assert not [q["sql"] for q in queries if "jobs_joblogline" in q["sql"]]
