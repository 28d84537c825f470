"""Redis restarted while jobs run and telemetry flows, with every part a real process: the web server, the portal's
Celery worker (with beat), the scheduler, the telemetry ingest and two node agents (simulated GPUs, process
runtime), all on a PRIVATE redis-server that the test kills and starts again, empty (no persistence: queued broker
messages, the telemetry stream and its consumer group are gone, as after a real Redis restart without a volume).

What must hold: the REST API keeps answering (and accepts jobs) while Redis is down; the agents, the worker, the
scheduler and the ingest reconnect by themselves; telemetry resumes within seconds; every job ends exactly once
with the right outcome; the ledger bills each job's GPU time once; no log line is lost or doubled, including the
ones the broker had accepted but the portal had not yet taken when Redis died (the worker is paused so that there
are some: the agents send their recent job reports again, see workers/transport.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import requests
from django.utils import timezone

from apps.booking.models import Allocation
from apps.jobs.models import ContainerImage, Job, JobEvent
from portal.redis_url import RedisTarget
from tests.fleet.procs import start_ingest, wait_for
from tests.jobs.stack import TERMINAL, Stack, start_stack
from tests.support.private_services import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

IMAGE = "local/process"
OUTAGE_S = 5.0


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    """The test process and every child it starts use this Redis (settings.REDIS is what subprocess_env and the
    agents' broker URL are built from)."""
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
def stack(tmp_path: Any, private_redis: PrivateRedis, alice: Any, vision: Any, make_token: Any) -> Iterator[Stack]:
    ContainerImage.objects.create(name=IMAGE, description="local processes")
    running = start_stack(
        tmp_path,
        user=alice,
        make_token=make_token,
        runtime="process",
        nodes=2,
        gpus=4,
        # Production's heartbeat timeout (30 s) outlasts the outage; so must this one, or the nodes go offline.
        worker_env={"FLEET_HEARTBEAT_TIMEOUT_S": "20"},
    )
    running.extra.append(start_ingest(tmp_path))
    yield running
    running.stop()


def _sampled_after(stack: Stack, moment: float) -> bool:
    gpus = stack.api("GET", "/api/v1/gpus/").json()["results"]
    stamps = [g["sampled_at"] for g in gpus if g["sampled_at"]]
    return len(stamps) == 8 and all(timezone.datetime.fromisoformat(s).timestamp() > moment for s in stamps)


def _queued_lines(server: PrivateRedis, prefix: str) -> int:
    """Log lines starting with `prefix` in the jobs.report_logs messages waiting in the control list."""
    count = 0
    for raw in redis.Redis.from_url(server.url(0)).lrange("control", 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] != "jobs.report_logs":
            continue
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        count += sum(line[1].startswith(prefix) for batch in args[0]["batches"] for line in batch["lines"])
    return count


def test_redis_restart_during_jobs_loses_and_doubles_nothing(stack: Stack, private_redis: PrivateRedis) -> None:
    # Telemetry flows before the fault.
    wait_for(lambda: _sampled_after(stack, time.time() - 5), 30, "telemetry from all 8 GPUs", stack.procs)

    # Eight one-GPU jobs fill the two 4-GPU nodes; they outlive the outage.
    script = "echo start {i}; sleep 4; echo middle {i}; sleep 10; echo end {i}"
    before = [stack.submit(image=IMAGE, command=["sh", "-c", script.format(i=i)]) for i in range(8)]
    for job in before:
        stack.wait_state(job["id"], {"running"}, timeout=60)
        wait_for(lambda job=job: len(stack.logs(job["id"])) == 1, 30, "the start line", stack.procs)

    # The portal's worker pauses: the "middle" lines wait in the broker's control list, and die with it.
    os.kill(stack.worker.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _queued_lines(private_redis, "middle") == 8, 30, "the middle lines in the broker", stack.procs)
        private_redis.stop()
    finally:
        os.kill(stack.worker.pid, signal.SIGCONT)
    down_at = time.time()
    # The REST API answers from the database while Redis is away, and accepts new work.
    for path in ("/api/v1/jobs/", "/api/v1/gpus/", "/api/v1/nodes/", f"/api/v1/jobs/{before[0]['id']}/"):
        resp = stack.api("GET", path)
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
    during = stack.submit(image=IMAGE, command=["sh", "-c", "echo queued during the outage"])
    assert during["state"] == "queued"
    time.sleep(max(0.0, OUTAGE_S - (time.time() - down_at)))
    private_redis.start()  # empty: no queues, no telemetry stream, no consumer group
    up_at = time.time()

    # Telemetry resumes by itself (agents reconnect, the ingest recreates its group).
    wait_for(lambda: _sampled_after(stack, up_at), 30, "telemetry after the restart", stack.procs)
    telemetry_back_s = time.time() - up_at

    # Every job ends, once, as it should: the running ones succeed, the one queued during the outage runs.
    finals = {job["id"]: stack.wait_done(job["id"], timeout=90) for job in [*before, during]}
    after = [stack.submit(image=IMAGE, command=["sh", "-c", f"echo after {i}"]) for i in range(4)]
    finals |= {job["id"]: stack.wait_done(job["id"], timeout=60) for job in after}
    outcomes = {jid: (j["state"], j["reason"], j["exit_code"]) for jid, j in finals.items()}
    assert set(outcomes.values()) == {("succeeded", "exit_code", 0)}, outcomes
    for job in before:
        lines = [line["line"] for line in stack.logs(job["id"])]
        n = lines[0].split()[-1]
        assert lines == [f"start {n}", f"middle {n}", f"end {n}"], lines  # each line once, across the restart

    ids = list(finals)
    for job_id in ids:
        states = list(JobEvent.objects.filter(job_id=job_id).values_list("to_state", flat=True))
        assert states.count("running") == 1 and sum(s in TERMINAL for s in states) == 1, (job_id, states)
        assert states[-1] == "succeeded", (job_id, states)
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == len(ids)

    # Each job held one GPU, freed when it ended; the ledger bills that time once, however often it is closed.
    from apps.billing.models import UsageRecord
    from apps.billing.services import ledger_close

    later = timezone.now() + timedelta(minutes=10)
    ledger_close(now=later)
    ledger_close(now=later)
    for job_id in ids:
        allocations = list(Allocation.objects.filter(kind="job", job_id=job_id))
        assert len(allocations) == 1, (job_id, allocations)
        held = (allocations[0].end - allocations[0].start).total_seconds()
        job = Job.objects.get(pk=job_id)
        assert job.ended_at is not None and allocations[0].end <= job.ended_at + timedelta(seconds=1)
        billed = sum(UsageRecord.objects.filter(source="job", source_id=job_id).values_list("gpu_seconds", flat=True))
        assert abs(billed - held) <= 1, (job_id, billed, held)
    assert all(p.alive() for p in stack.procs), [p.argv for p in stack.procs if not p.alive()]
    print(f"telemetry back {telemetry_back_s:.1f}s after Redis restarted; {len(ids)} jobs, each once")
    assert requests.get(stack.server.url + "/api/v1/health", timeout=10).status_code == 200
