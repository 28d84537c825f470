"""An idle job (no reservation) over real minute rollups: warned, then asked to stop with reason idle; the node's
exit report ends it cancelled with reason idle; the stop is audited and published."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.efficiency import services
from apps.efficiency.models import IdleMark, MarkState
from apps.events.models import OutboxEvent
from apps.fleet.models import GpuStatus, NodeStatus
from apps.jobs import services as jobs
from apps.jobs.models import ContainerImage, Job, JobReason, JobState
from tests.efficiency.conftest import write_minutes
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_job(alice: Any, vision: Any) -> tuple[Job, Any]:
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.5000"))
    node = NodeFactory(name="n1", status=NodeStatus.ONLINE, last_heartbeat=timezone.now())
    node.token_digest = "d" * 64
    node.save(update_fields=["token_digest"])
    gpu = GpuFactory(node=node, index=0, model=model, uuid="GPU-idle-0", status=GpuStatus.OK)
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    job = jobs.job_submit(
        user=alice, team=vision, image="portal-test/busybox:latest", command=["sleep", "1d"], max_duration_s=6 * 3600
    )
    job = jobs.job_start(job=job, node=node, gpus=[gpu], now=timezone.now())
    return jobs.job_transition(job, JobState.RUNNING), gpu


def test_idle_job_is_stopped_with_reason_idle(running_job):
    job, gpu = running_job
    start = job.started_at.replace(second=0, microsecond=0)
    write_minutes(gpu, start, 70, util=0, mem=300)
    first = start + timedelta(minutes=71)
    assert services.idle_scan(now=first).warned == [f"jobs/{job.pk}"]
    write_minutes(gpu, start + timedelta(minutes=70), 16, util=0, mem=300)
    result = services.idle_scan(now=first + timedelta(minutes=16))
    assert result.reclaimed == [f"jobs/{job.pk}"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.stop_reason == JobReason.IDLE  # the node stops it
    assert AuditEvent.objects.filter(action="job.idle_stop", target_id=str(job.pk)).exists()
    assert OutboxEvent.objects.filter(event_type="idle.reclaimed", subject=f"jobs/{job.pk}").exists()
    mark = IdleMark.objects.get(kind="job", source_id=job.pk)
    assert mark.state == MarkState.RECLAIMED and mark.reclaimed_gpu_hours > 0
    assert services.idle_scan(now=first + timedelta(minutes=17)).reclaimed == []  # once

    assert jobs.job_report_exit(
        node_id=job.node_id,
        job_id=job.pk,
        state="cancelled",
        reason="cancelled",
        exit_code=137,
        message="stopped",
        finished_at=timezone.now(),
    )
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.reason == JobReason.IDLE
