"""A MIG instance or a share booked now goes where nothing outside the portal uses the memory, when another fits."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from apps.core.redis import get_redis
from apps.fleet.devices import gpu_set_shares
from apps.telemetry import keys
from tests.booking.conftest import current_slot, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def latest() -> Iterator[Callable[..., None]]:
    r = get_redis()
    r.delete(keys.LATEST)

    def write(uuid: str, mem_used: int, **extra: Any) -> None:
        sample = {"uuid": uuid, "util": 0, "mem_used": mem_used, "mem_total": 81920, "ts": time.time(), **extra}
        r.hset(keys.LATEST, uuid, json.dumps(sample))

    yield write
    r.delete(keys.LATEST)


def _book(client: Any, *, now: bool = True, **asked: Any) -> str:
    start, end = current_slot(hours=1) if now else slot(days=1)
    body = {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **asked}
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    return str(response.json()["gpus"][0]["uuid"])


def test_a_mig_instance_in_use_outside_the_portal_is_taken_last(api_as, alice, sharing_fleet, latest):
    # Someone's process on the first instance (its own reading), a trace of memory on the second.
    latest("GPU-mig-0", 5200, mig_mem={"MIG-mig-0-7": 5000, "MIG-mig-0-8": 200})
    client = api_as(alice)
    assert _book(client, mig_profile="1g.10gb") == "MIG-mig-0-8"
    assert _book(client, now=False, mig_profile="1g.10gb") == "MIG-mig-0-7"  # tomorrow: says nothing of then


def test_a_share_goes_to_a_shared_gpu_nothing_outside_the_portal_uses(api_as, alice, sharing_fleet, latest):
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-1", shares=4)
    latest("GPU-shared-0", 20480)  # no share of it is held: this is someone's process
    client = api_as(alice)
    assert _book(client, gpu_share=0.25) == "GPU-shared-1"
    # Best fit as before once a GPU is partly held: the next quarter joins the first on GPU-shared-1.
    assert _book(client, gpu_share=0.25) == "GPU-shared-1"
    # Never a reason to refuse: with GPU-shared-1 full, the half goes to GPU-shared-0.
    assert _book(client, gpu_share=0.5) == "GPU-shared-1"
    assert _book(client, gpu_share=0.5) == "GPU-shared-0"


def test_a_job_on_a_part_in_use_outside_the_portal_says_so_on_its_start(alice, vision, ready, sent, latest):
    from apps.booking.models import Allocation
    from apps.jobs import scheduler, services
    from apps.jobs.models import JobEvent
    from apps.jobs.scheduling import FAIR

    def submit(**asked: Any) -> int:
        job = services.job_submit(
            user=alice, team=vision, image="portal-test/busybox:latest", command=["true"], max_duration_s=600, **asked
        )
        return int(job.pk)

    # Every instance of the MIG GPU carries someone's process; the one split GPU too.
    latest("GPU-mig-0", 35000, mig_mem={f"MIG-mig-0-{gi}": 5000 for gi in range(7, 14)})
    latest("GPU-shared-0", 20480)
    clean = submit(mig_profile="1g.10gb", gpu_count=1)
    started = scheduler.run_pass(token=1, leader="test", policy=FAIR).started
    assert clean in started
    first = Allocation.objects.get(job_id=clean).gpu.uuid
    assert first == "MIG-mig-0-7"  # none is free of it: the first by index, as always
    messages = {e.job_id: e.message for e in JobEvent.objects.filter(to_state="starting")}
    assert messages[clean] == (
        "memory in use outside the portal on mig/0 1g.10gb (4.9 GiB): no part free of such use fitted"
    )
    quarter = submit(gpu_share=0.25)
    assert quarter in scheduler.run_pass(token=1, leader="test", policy=FAIR).started
    messages = {e.job_id: e.message for e in JobEvent.objects.filter(to_state="starting")}
    assert messages[quarter] == (
        "memory in use outside the portal on shared/0 share (20.0 GiB): no part free of such use fitted"
    )
