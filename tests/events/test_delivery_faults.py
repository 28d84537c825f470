"""A job's life and two reservations' lives reach a webhook receiver as signed CloudEvents while the Celery worker
is killed mid-delivery and Redis is restarted empty: every event is delivered at least once, none is lost, and
repeated deliveries carry the same `webhook-id` (and CloudEvent id), so the receiver can recognise them.

Everything that matters is a real process: the web server (registration and some of the changes go through the
REST API, whose after-commit nudges reach the private broker), the portal's Celery worker with beat, a private
redis-server the test kills. Changes made by the test process itself (job transitions an agent would report, the
lifecycle tick) nudge the shared broker no worker of this test reads: those events reach the receiver only
through the periodic sweep, which is the path a lost broker message takes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.utils import timezone

from apps.booking import services as booking
from apps.events.models import DeliveryStatus, OutboxEvent, WebhookDelivery
from apps.jobs import services as jobs
from apps.jobs.models import ContainerImage, Job, JobState
from portal.redis_url import RedisTarget
from tests.conftest import LiveServer, start_live_server
from tests.events.receiver import Receiver
from tests.factories import GpuFactory, NodeFactory
from tests.fleet.procs import Proc, start_portal_worker, wait_for
from tests.support.private_services import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(400)]

IMAGE = "local/process"
LOOPBACK = {"WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
WORKER_ENV = {
    **LOOPBACK,
    "EVENTS_SWEEP_EVERY_S": "2",
    "WEBHOOK_BACKOFF_BASE_S": "1",
    "WEBHOOK_BACKOFF_MAX_S": "4",
    "WEBHOOK_TIMEOUT_S": "2",
    "EVENTS_CLAIM_LEASE_S": "6",
}


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    """Children started by the test (web server, worker) use this Redis; see tests/hardening."""
    from apps.core.redis import get_redis, get_request_redis

    server = PrivateRedis()
    server.start()
    settings.REDIS_URL = server.url(0)
    settings.REDIS = RedisTarget.parse(settings.REDIS_URL)
    get_redis.cache_clear()
    get_request_redis.cache_clear()
    try:
        yield server
    finally:
        get_redis.cache_clear()
        get_request_redis.cache_clear()
        server.destroy()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver(slow_s=3.0)
    yield running
    running.stop()


@pytest.fixture
def portal(private_redis: PrivateRedis) -> Iterator[LiveServer]:
    server = start_live_server(**LOOPBACK)
    yield server
    server.stop()


def _api(server: LiveServer, token: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return requests.request(method, f"{server.url}{path}", headers=headers, timeout=30, **kwargs)


def _slot_now() -> tuple[Any, Any]:
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    return start, start + timedelta(hours=1)


def _all_delivered() -> bool:
    owed = WebhookDelivery.objects.exclude(status=DeliveryStatus.SUCCEEDED).exists()
    undispatched = OutboxEvent.objects.filter(dispatched_at__isnull=True).exists()
    return not owed and not undispatched


def test_lives_delivered_across_worker_kill_and_redis_restart(
    tmp_path: Any, private_redis: PrivateRedis, portal: LiveServer, receiver: Receiver, alice: Any, make_token: Any
) -> None:
    ContainerImage.objects.create(name=IMAGE)
    node = NodeFactory(name="eventsnode")
    gpus = [GpuFactory(node=node, index=i, uuid=f"GPU-events-{i}") for i in range(2)]
    token = make_token(alice, ["read", "jobs:write", "reservations:write", "webhooks:write"])

    created = _api(
        portal, token, "POST", "/api/v1/webhooks/",
        json={"team": "vision", "url": receiver.url, "events": ["job.*", "reservation.*"]},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    receiver.secret = created.json()["secret"]
    procs: list[Proc] = [start_portal_worker(tmp_path, **WORKER_ENV)]

    # 1. The worker is killed while it is inside a delivery (the receiver holds the request).
    receiver.hold_next()
    job_a = _api(portal, token, "POST", "/api/v1/jobs/", json={"team": "vision", "image": IMAGE, "command": ["true"]})
    assert job_a.status_code == 201, job_a.text
    wait_for(receiver.holding.is_set, 60, "the first delivery in flight", procs)
    procs[0].kill()
    receiver.release()

    # 2. With no worker: job A runs and succeeds; job B is cancelled, C fails, D is lost; a reservation is booked
    # for now (created, started) and released.
    a = Job.objects.get(pk=job_a.json()["id"])
    for state in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        jobs.job_transition(a, state, reason="exit_code" if state == JobState.SUCCEEDED else "", exit_code=0)
    job_b = _api(portal, token, "POST", "/api/v1/jobs/", json={"team": "vision", "image": IMAGE, "command": ["true"]})
    assert _api(portal, token, "POST", f"/api/v1/jobs/{job_b.json()['id']}/cancel/").status_code == 202
    for path in ([JobState.STARTING, JobState.FAILED], [JobState.STARTING, JobState.RUNNING, JobState.LOST]):
        job = jobs.job_submit(user=alice, team=alice.memberships.get().team, image=IMAGE, command=["true"])
        for state in path:
            jobs.job_transition(job, state, reason="node_lost" if state == JobState.LOST else "exit_code")
    start, end = _slot_now()
    booked = _api(
        portal, token, "POST", "/api/v1/reservations/",
        json={"team": "vision", "start": start.isoformat(), "end": end.isoformat(), "gpus": [gpus[0].uuid]},
    )  # fmt: skip
    assert booked.status_code == 201, booked.text
    assert _api(portal, token, "DELETE", f"/api/v1/reservations/{booked.json()['id']}/").status_code == 200

    # 3. Redis dies (the broker's queued messages with it); a reservation for tomorrow is booked, starts and ends
    # (the lifecycle tick, run at those times); Redis comes back empty and a new worker starts.
    private_redis.stop()
    tomorrow = start + timedelta(days=1)
    later = booking.reservation_create(
        user=alice, team=alice.memberships.get().team, start=tomorrow, end=tomorrow + timedelta(hours=1),
        gpus=[gpus[1].uuid],
    ).reservation  # fmt: skip
    booking.reservations_tick(now=tomorrow + timedelta(minutes=1))
    booking.reservations_tick(now=tomorrow + timedelta(hours=1, minutes=1))
    private_redis.start()
    procs.append(start_portal_worker(tmp_path, **WORKER_ENV))
    try:
        wait_for(_all_delivered, 180, "every event delivered", procs)
    finally:
        for proc in procs:
            proc.stop()

    # Each life, as published, in order.
    expected = {
        f"jobs/{a.pk}": ["job.queued", "job.running", "job.succeeded"],
        f"jobs/{job_b.json()['id']}": ["job.queued", "job.cancelled"],
        f"reservations/{booked.json()['id']}": ["reservation.created", "reservation.started", "reservation.released"],
        f"reservations/{later.pk}": ["reservation.created", "reservation.started", "reservation.ended"],
    }
    published = defaultdict(list)
    for event in OutboxEvent.objects.order_by("id"):
        published[event.subject].append(event.event_type)
    for subject, types in expected.items():
        assert published[subject] == types, (subject, published[subject])
    assert sorted(t for types in published.values() for t in types if t in {"job.failed", "job.lost"}) == [
        "job.failed",
        "job.lost",
    ]

    # Every event reached the receiver, signed (verified by the reference library), as a CloudEvent.
    assert receiver.rejected == []
    outbox = {str(e.uuid): e for e in OutboxEvent.objects.all()}
    accepted = {r.event["id"] for r in receiver.received if r.answered == 200}
    assert accepted == set(outbox), set(outbox) - accepted
    for r in receiver.received:
        event = outbox[r.event["id"]]
        assert r.event["specversion"] == "1.0" and r.event["type"] == f"portal.{event.event_type}"
        assert r.event["subject"] == event.subject and r.event["datacontenttype"] == "application/json"
        assert r.event["data"] == event.data and r.event["source"] and r.event["time"]

    # Duplicates are recognisable: a webhook-id always carries the same event, and each event has one webhook-id.
    by_id: dict[str, set[str]] = defaultdict(set)
    for r in receiver.received:
        by_id[r.webhook_id].add(r.event["id"])
    assert all(len(ids) == 1 for ids in by_id.values())
    assert len(by_id) == len(outbox)
    assert any(sum(1 for r in receiver.received if r.webhook_id == w) > 1 for w in by_id)

    # The delivery log says so: each one succeeded, after at least two attempts (the first always got a 500).
    for delivery in WebhookDelivery.objects.all():
        assert delivery.status == DeliveryStatus.SUCCEEDED and delivery.response_code == 200
        assert delivery.attempts >= 2 and delivery.delivered_at is not None
