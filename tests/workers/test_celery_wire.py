"""workers/internals/celery_wire.py writes what Celery's send_task writes, and a Celery worker runs it.

The comparison runs against the installed Celery and kombu through a real Redis, so an upgrade that changes the
message format fails here; the end-to-end job tests (tests/jobs/stack.py: real agents and a real portal worker)
run every launch and report through these messages.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery
from django.conf import settings

from workers.internals import celery_wire

# Differ per message or per sender by design: ids, the sending process, the result queue Celery names per thread.
PER_MESSAGE = {"id", "root_id", "correlation_id", "delivery_tag", "origin", "reply_to", "expires"}


@pytest.fixture
def broker() -> Any:
    client = redis.Redis.from_url(settings.REDIS.redis_py_url)
    yield client
    client.close()


def _celery(url: str) -> Celery:
    app = Celery(f"wire-test-{uuid.uuid4().hex[:6]}", broker=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True)
    return app


def _compare(ours: Any, theirs: Any, path: str = "") -> None:
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), f"{path}: keys {set(ours) ^ set(theirs)}"
        for key in theirs:
            if key not in PER_MESSAGE:
                _compare(ours[key], theirs[key], f"{path}.{key}")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


@pytest.mark.parametrize("expires_s", [None, 30.0])
def test_the_message_is_the_one_send_task_writes(broker: Any, expires_s: float | None) -> None:
    queue = f"wire-test.{uuid.uuid4().hex}"
    args = [{"node": "gpu-01", "job_id": 7, "env": {"A": "é"}, "ts": 1796230800.5}]
    app = _celery(settings.CELERY_BROKER_URL)
    try:
        app.send_task(
            "jobs.report_exit", args=args, queue=queue, expires=expires_s, ignore_result=True,
            argsrepr="(jobs.report_exit)", kwargsrepr="{}",
        )  # fmt: skip
        celery_wire.publish(
            broker, "jobs.report_exit", args, queue=queue, expires_s=expires_s, argsrepr="(jobs.report_exit)"
        )
        ours, theirs = (json.loads(raw) for raw in broker.lrange(queue, 0, -1))  # LPUSH: the newest first
    finally:
        broker.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        app.close()
    _compare(ours, theirs)
    assert json.loads(base64.b64decode(ours["body"])) == json.loads(base64.b64decode(theirs["body"]))
    assert json.loads(base64.b64decode(ours["body"]))[0] == args
    if expires_s is None:
        assert ours["headers"]["expires"] is None and "expiration" not in ours["properties"]
    else:
        gap = datetime.fromisoformat(theirs["headers"]["expires"]) - datetime.fromisoformat(ours["headers"]["expires"])
        assert abs(gap.total_seconds()) < 5
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]


def test_a_celery_worker_runs_the_message_and_drops_an_expired_one(broker: Any) -> None:
    """A real Celery worker process (tests/workers/wire_app.py) consumes what celery_wire wrote."""
    queue = f"wire-test.{uuid.uuid4().hex}"
    broker.delete("wire-test-ran")
    celery_wire.publish(broker, "wire.test_task", [{"n": 1}], queue=queue, expires_s=-1.0)  # already expired
    celery_wire.publish(broker, "wire.test_task", [{"n": 2, "text": "ü"}], queue=queue, expires_s=60.0)
    env = {
        **os.environ,
        "WIRE_TEST_BROKER": settings.CELERY_BROKER_URL,
        "WIRE_TEST_REDIS": settings.REDIS.redis_py_url,
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.workers.wire_app", "worker", "--pool", "solo", "-Q", queue,
         "--without-heartbeat", "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        ran = broker.blpop(["wire-test-ran"], timeout=60)
        time.sleep(0.5)  # anything else it would have run by now
        assert ran is not None, "the worker ran nothing"
        assert json.loads(ran[1]) == {"n": 2, "text": "ü"}
        assert broker.llen("wire-test-ran") == 0  # the expired one was dropped, not run
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
        broker.delete(queue, "wire-test-ran")
    assert "Discarding revoked task: wire.test_task" in output  # Celery's word for an expired message


def test_the_agents_consumer_takes_a_command_without_unacked_bookkeeping() -> None:
    """The agent's Celery app (workers/transport.make_celery) reads its queue with kombu's ack emulation off: a
    received command is not written to the broker's `unacked` hash (two MULTI/EXEC round trips per message)."""
    from tests.support.private_services import PrivateRedis
    from workers.transport import make_celery, node_queue

    with PrivateRedis() as server:
        url = server.url(0)
        client = redis.Redis.from_url(url)
        app = make_celery(url, "n1")
        try:
            celery_wire.publish(client, "agent.launch_job", [{"job_id": 1}], queue=node_queue("n1"))
            with app.connection_for_read() as conn:
                queue = conn.SimpleQueue(node_queue("n1"), no_ack=False)
                message = queue.get(timeout=10)
                assert message.payload[0] == [{"job_id": 1}]
                assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
                message.ack()
                queue.close()
        finally:
            app.close()
            client.close()
