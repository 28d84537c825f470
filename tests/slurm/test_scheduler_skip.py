"""The portal's scheduler leaves a Slurm pool alone: it places nothing on the pool's GPUs (even on a node with an
agent token, as a telemetry-only agent has) and does not place a job already handed to the pool's bridge."""

from __future__ import annotations

from typing import Any

import pytest

from apps.fleet.models import Pool, PoolBackend
from apps.jobs import scheduler
from apps.jobs.models import JobState
from apps.jobs.scheduling import FAIR
from apps.pools.models import ExternalJob
from tests.jobs.conftest import fleet, images, submit  # noqa: F401 - fixtures


@pytest.mark.django_db
def test_scheduler_skips_slurm_pool_gpus_and_bridged_jobs(alice: Any, vision: Any, fleet: Any, submit: Any) -> None:  # noqa: F811
    pool = Pool.objects.create(name="cluster", backend=PoolBackend.SLURM)
    fleet["node02"].pool = pool
    fleet["node02"].save(update_fields=["pool"])
    on_slurm_gpus = submit(alice, vision, gpu_count=1, gpu_model="H100-80GB")
    handed_over = submit(alice, vision, gpu_count=1, gpu_model="A100-80GB")
    ExternalJob.objects.create(job=handed_over, pool=pool)
    placeable = submit(alice, vision, gpu_count=1, gpu_model="A100-80GB")
    result = scheduler.run_pass(token=1, leader="test", policy=FAIR)
    assert result.started == [placeable.pk]
    for job in (on_slurm_gpus, handed_over):
        job.refresh_from_db()
        assert job.state == JobState.QUEUED and job.node_id is None
