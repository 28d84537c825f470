"""A booking that starts now is placed on GPUs nothing outside the portal uses, where the node has them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from apps.core.redis import get_redis
from apps.telemetry import keys
from tests.booking.conftest import book_body, current_slot, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def latest_memory() -> Iterator[Callable[[str, int], None]]:
    r = get_redis()
    r.delete(keys.LATEST)

    def write(uuid: str, mem_used: int) -> None:
        sample = {"uuid": uuid, "util": 0, "mem_used": mem_used, "mem_total": 81920, "ts": time.time()}
        r.hset(keys.LATEST, uuid, json.dumps(sample))

    yield write
    r.delete(keys.LATEST)


def _booked(client, **window) -> list[str]:
    response = client.post(URL, book_body(gpu_model="H100-80GB", gpu_count=1, **window), format="json")
    assert response.status_code == 201, response.json()
    return [g["uuid"] for g in response.json()["gpus"]]


def test_a_booking_that_starts_now_avoids_a_gpu_in_use_outside_the_portal(alice, api_as, fleet, latest_memory):
    latest_memory("GPU-small-4", 20480)  # someone's process on small/4, the GPU the booking would get
    latest_memory("GPU-small-5", 600)  # the driver's own
    client = api_as(alice, scopes=["read", "reservations:write"])
    start, end = current_slot(hours=1)
    assert _booked(client, start=start, end=end) == ["GPU-small-5"]
    # Never a reason to refuse: the next one gets the GPU in use, the only H100 left.
    assert _booked(client, start=start, end=end) == ["GPU-small-4"]


def test_a_later_booking_is_placed_as_usual(alice, api_as, fleet, latest_memory):
    latest_memory("GPU-small-4", 20480)
    client = api_as(alice, scopes=["read", "reservations:write"])
    start, end = slot(days=1)
    assert _booked(client, start=start, end=end) == ["GPU-small-4"]  # what runs there now says nothing of tomorrow


def test_a_gpu_the_portal_released_a_moment_ago_is_not_in_use_outside_it(alice, fleet, latest_memory):
    from django.utils import timezone

    from apps.booking.models import Allocation
    from apps.booking.services.gpus import _in_use_outside, gpus_by_uuid

    latest_memory("GPU-small-4", 20480)
    latest_memory("GPU-small-5", 20480)
    now = timezone.now()
    for uuid, ended in (("GPU-small-4", now - timedelta(seconds=10)), ("GPU-small-5", now - timedelta(minutes=2))):
        Allocation.objects.create(
            gpu=fleet["gpus"][f"small/{uuid[-1]}"], team=alice.memberships.get().team, user=alice, kind="job",
            start=ended - timedelta(hours=1), end=ended,
        )  # fmt: skip
    free = list(gpus_by_uuid(["GPU-small-4", "GPU-small-5"], now, now + timedelta(hours=1)).values())
    # small/4's memory may still be the job that ended there 10 s ago; small/5's job ended 2 minutes ago.
    model = fleet["gpus"]["small/4"].model_id
    assert _in_use_outside(model, free, now) == {fleet["gpus"]["small/5"].pk}
    assert _in_use_outside(model, free, now + timedelta(hours=1)) == set()  # a booking an hour away
