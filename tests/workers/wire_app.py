"""A minimal Celery app for tests/workers/test_celery_wire.py, run as its own worker process.

Its one task records its argument in Redis (list `wire-test-ran`), so the test sees what the worker ran."""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

BROKER = os.environ["WIRE_TEST_BROKER"]
REDIS = os.environ["WIRE_TEST_REDIS"]

app = Celery("wire-test", broker=BROKER)
app.conf.update(task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True)


@app.task(name="wire.test_task")
def wire_test_task(payload: dict[str, Any]) -> None:
    redis.Redis.from_url(REDIS).rpush("wire-test-ran", json.dumps(payload))
