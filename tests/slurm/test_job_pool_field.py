# ruff: noqa: F811
"""A job may name a pool instead of GPUs (DESIGN.md, pools): that pool's scheduler chooses. The job is narrowed to
the pool's models, so a Slurm pool's bridge claims it and the portal's scheduler leaves it alone; a pool that does
not exist, has no such GPUs, or shares its models with GPUs elsewhere is a 400 on the `pool` field."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.fleet.models import Pool, PoolBackend
from apps.jobs import scheduler
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import FAIR
from apps.pools import selectors
from tests.jobs.conftest import BUSYBOX, fleet, images, submit  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(fleet: Any) -> Pool:
    pool = Pool.objects.create(name="cluster", backend=PoolBackend.SLURM)
    fleet["node02"].pool = pool
    fleet["node02"].save(update_fields=["pool"])
    return pool


def post(user: Any, body: dict[str, Any]) -> Any:
    client = APIClient()
    client.force_authenticate(user)
    base = {"team": "vision", "image": BUSYBOX, "command": ["echo", "hi"], "max_duration_s": 600}
    return client.post("/api/v1/jobs/", {**base, **body}, format="json")


def test_a_job_naming_the_slurm_pool_goes_to_its_bridge(alice: Any, vision: Any, cluster: Pool, images: Any) -> None:
    response = post(alice, {"pool": "cluster"})
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.gpu_models == ["H100-80GB"]
    assert selectors.routed_pool(job.gpu_models) == cluster
    assert [j.pk for j in selectors.unclaimed_jobs(cluster)] == [job.pk]
    result = scheduler.run_pass(token=1, leader="test", policy=FAIR)
    assert job.pk not in result.started
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_job_naming_an_agents_pool_stays_with_the_portal(alice: Any, vision: Any, fleet: Any, images: Any) -> None:
    lab = Pool.objects.create(name="lab", backend=PoolBackend.AGENTS)
    fleet["node01"].pool = lab
    fleet["node01"].save(update_fields=["pool"])
    response = post(alice, {"pool": "lab"})
    assert response.status_code == 201, response.content
    assert response.json()["gpu_models"] == ["A100-80GB"]
    result = scheduler.run_pass(token=1, leader="test", policy=FAIR)
    assert result.started == [response.json()["id"]]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"pool": "nowhere"}, "There is no pool 'nowhere'"),
        ({"pool": "cluster", "gpu_model": "A100-80GB"}, "has no A100-80GB GPUs"),
        ({"pool": ""}, "may not be blank"),
    ],
)
def test_refusals_name_the_pool_field(
    alice: Any,
    vision: Any,
    cluster: Pool,
    images: Any,
    body: dict[str, Any],
    says: str,
) -> None:
    response = post(alice, body)
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["code"] == "invalid" and says in error["fields"]["pool"][0]
    assert not Job.objects.exists()


def test_a_model_the_pool_shares_with_other_nodes_cannot_be_routed(
    alice: Any,
    vision: Any,
    cluster: Pool,
    fleet: Any,
    images: Any,
) -> None:
    fleet["gpus01"][0].model = fleet["h100"]
    fleet["gpus01"][0].save(update_fields=["model"])
    response = post(alice, {"pool": "cluster"})
    assert response.status_code == 400
    assert "also outside pool 'cluster'" in response.json()["fields"]["pool"][0]
