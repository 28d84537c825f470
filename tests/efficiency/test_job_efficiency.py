"""The job API's gpu_memory_peak_mib, gpu_utilization_mean and advice, and the job page's memory curve, from real
minute rollups and log lines; the demo's OOM job has its curve."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.efficiency.demo import oom_memory_curve
from apps.fleet.models import GpuStatus, NodeStatus
from apps.jobs.models import Job, JobLogLine, JobReason, JobState
from tests.efficiency.conftest import write_minutes
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def oom_job(alice: Any, vision: Any) -> Job:
    model = GpuModelFactory(name="H100-80GB", memory_mib=81920, hourly_price=Decimal("3.9"))
    node = NodeFactory(name="n1", status=NodeStatus.ONLINE, last_heartbeat=timezone.now())
    gpu = GpuFactory(node=node, index=0, model=model, uuid="GPU-oom-0", status=GpuStatus.OK)
    started = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["python", "train.py"], gpu_count=1, cpus=Decimal(4),
        memory_mib=16384, max_duration_s=3600, state=JobState.FAILED, reason=JobReason.EXIT_CODE, exit_code=1,
        node=node, started_at=started, ended_at=started + timedelta(minutes=14),
    )  # fmt: skip
    job.gpus.set([gpu])
    assert oom_memory_curve(gpu=gpu, start=started, minutes=14) == 14
    JobLogLine.objects.bulk_create(
        [
            JobLogLine(job=job, seq=1, at=started, line="step 1/500 loss=2.41"),
            JobLogLine(
                job=job, seq=2, at=started, line="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
            ),
        ]
    )
    return job


def test_api_gives_peak_mean_and_advice_with_numbers(api_as, alice, oom_job):
    body = api_as(alice).get(f"/api/v1/jobs/{oom_job.pk}/").json()
    assert body["gpu_memory_peak_mib"] == 81920
    assert 85 <= body["gpu_utilization_mean"] <= 95
    assert [a["code"] for a in body["advice"]] == ["cuda_oom", "amp"]
    assert "peak 81920 of 81920 MiB" in body["advice"][0]["detail"]


def test_job_page_plots_the_memory_curve_and_names_the_oom_kind(alice, oom_job):
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{oom_job.pk}/").content.decode()
    assert 'id="chart-job-gpu"' in page and 'id="job-efficiency-data"' in page
    assert 'data-kind="cuda_oom"' in page and "CUDA out of memory" in page
    assert 'data-code="amp"' in page and "portal/pages/job_efficiency.js" in page


def test_a_queued_job_has_no_figures(api_as, alice, vision):
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=60,
    )  # fmt: skip
    body = api_as(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["gpu_memory_peak_mib"] is None and body["gpu_utilization_mean"] is None and body["advice"] == []


def test_two_gpus_one_idle_advises_fewer(api_as, alice, vision):
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.2"))
    node = NodeFactory(name="n2", status=NodeStatus.ONLINE, last_heartbeat=timezone.now())
    g0 = GpuFactory(node=node, index=0, model=model, uuid="GPU-f-0")
    g1 = GpuFactory(node=node, index=1, model=model, uuid="GPU-f-1")
    started = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=2, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=3600, state=JobState.RUNNING, started_at=started, node=node,
    )  # fmt: skip
    job.gpus.set([g0, g1])
    write_minutes(g0, started, 20, util=97, mem=60000)
    write_minutes(g1, started, 20, util=0, mem=400)
    body = api_as(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["gpu_memory_peak_mib"] == 60000 and body["gpu_utilization_mean"] == 48.5
    assert [a["code"] for a in body["advice"]] == ["fewer_gpus"]
    assert "Asked for 2 GPUs, used 1" in body["advice"][0]["detail"]
