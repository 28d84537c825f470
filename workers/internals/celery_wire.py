"""Celery task messages written straight onto a Redis broker queue: one LPUSH, no kombu producer.

The two hottest publishers send small tasks to a fixed queue several times per job: the scheduler's launch command
to a node (`apps/fleet/commands.py`) and an agent's job reports to the portal (`workers/transport.py`). Through
`Celery.send_task` most of such a message's CPU goes to routing, the task-sent signals, kombu's producer, its
connection bookkeeping and `ensure` retry wrapper, and the envelope built in three layers; built here it costs a
fraction of that for the same bytes on the wire (bench/internals_workers.py measures both, and the share of a
job's path on the agent).

What is written is exactly what `send_task` writes through kombu's Redis transport (Celery's task message protocol
2, https://docs.celeryq.dev/en/stable/internals/protocol.html, in kombu's JSON envelope with a base64 body), to the
list the consumers read (the queue's name, priority 0) via the anonymous exchange, as `send_task(queue=...)` does.
What it depends on, and the test that fails when an upgrade changes it: workers/internals/README.md.

No Django here: the node agent uses it too.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

# The third element of a protocol-2 body: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _origin() -> str:
    # What Celery puts there (celery.utils.nodenames.anon_nodename): the sending process.
    return f"gen{os.getpid()}@{socket.gethostname()}"


def task_message(
    task: str,
    args: list[Any],
    *,
    queue: str,
    expires_s: float | None = None,
    argsrepr: str = "",
    now: datetime | None = None,
) -> str:
    """The JSON kombu's Redis transport stores for `send_task(task, args, queue=queue, expires=expires_s,
    ignore_result=True, argsrepr=argsrepr, kwargsrepr="{}")`."""
    task_id = str(uuid.uuid4())
    expires = None
    expiration = None
    if expires_s is not None:
        expires = ((now or datetime.now(timezone.utc)) + timedelta(seconds=expires_s)).isoformat()  # noqa: UP017
        expiration = str(int(expires_s * 1000))
    body = json.dumps([args, {}, _EMBED]).encode()
    properties: dict[str, Any] = {
        "correlation_id": task_id,
        "reply_to": "",
        "argsrepr": argsrepr,
        "kwargsrepr": "{}",
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": str(uuid.uuid4()),
    }
    if expiration is not None:
        properties["expiration"] = expiration
    message = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": expires,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
            "origin": _origin(),
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": properties,
    }
    return json.dumps(message)


def publish(
    client: Any, task: str, args: list[Any], *, queue: str, expires_s: float | None = None, argsrepr: str = ""
) -> None:
    """Put one task message on `queue` of the Redis broker `client` (a redis-py client on the broker's database).
    Raises redis-py's errors when Redis cannot be reached (the callers keep the message and try again)."""
    client.lpush(queue, task_message(task, args, queue=queue, expires_s=expires_s, argsrepr=argsrepr))
