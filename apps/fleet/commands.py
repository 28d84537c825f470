"""Portal -> agent commands: Celery tasks on the node's own queue `node.<name>`, signed for that node.

A node's queue is reachable by anything that can talk to the broker, and every GPU node runs users' code. So each
command is signed with HMAC-SHA256 keyed by the node's token digest (which only the portal and that node's agent
can compute), and the agent refuses unsigned, foreign or stale commands (workers/transport.py `verify_command`).

Use `agent_send` for every command (booking's `agent.hold_gpus`, jobs' `agent.launch_job`/`agent.cancel_job`,
fleet's `agent.run_probe`); it sends after the surrounding transaction commits.

Envelope (the single argument of the task)::

    {"v": 1, "node": "gpu-01", "task": "agent.hold_gpus", "ts": 1796230800.0, "body": {...}, "sig": "<hex>"}
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from apps.core.errors import Conflict
from workers.internals import celery_wire

logger = logging.getLogger(__name__)

COMMAND_VERSION = 1


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def canonical(node: str, task: str, ts: float, body: dict[str, Any]) -> bytes:
    """The bytes that are signed (same function as workers.transport.canonical)."""
    return json.dumps(
        {"v": COMMAND_VERSION, "node": node, "task": task, "ts": ts, "body": body},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def sign_command(
    *, node_name: str, token_digest: str, task: str, body: dict[str, Any], ts: float | None = None
) -> dict[str, Any]:
    """The signed envelope of one command."""
    ts = round(time.time() if ts is None else ts, 3)
    sig = hmac.new(token_digest.encode(), canonical(node_name, task, ts, body), hashlib.sha256).hexdigest()
    return {"v": COMMAND_VERSION, "node": node_name, "task": task, "ts": ts, "body": body, "sig": sig}


def agent_send(*, node: Any, task: str, body: dict[str, Any], expires_s: float | None = None) -> None:
    """Send a signed command to the node's agent once the current transaction commits.

    `node` is an apps.fleet.models.Node (its token digest signs the command). Raises Conflict when the node has no
    token yet (no agent could verify the command)."""
    if node.pool_id is not None and node.pool.backend != "agents":
        return  # another scheduler's node (a Slurm pool): its bridge follows the portal's stop requests itself
    if not node.token_digest:
        raise Conflict(f"Node {node.name} has no node token; create one with manage.py create_node_token.")
    envelope = sign_command(node_name=node.name, token_digest=node.token_digest, task=task, body=body)
    queue = node_queue(node.name)

    def send() -> None:
        # argsrepr: not a repr of the envelope (a job's environment included) in the message headers, where broker
        # monitors show them.
        publish_command(queue, task, envelope, expires_s=expires_s, argsrepr=f"({task} for {node.name})")
        logger.info("sent %s to %s", task, queue)

    transaction.on_commit(send)


@functools.cache
def _broker() -> redis.Redis:
    # The broker's database (the same server and number as CELERY_BROKER_URL), with the broker's timeouts.
    return redis.Redis.from_url(
        settings.REDIS.redis_py_url, socket_connect_timeout=5, socket_timeout=10, retry_on_timeout=True
    )


def publish_command(
    queue: str, task: str, envelope: dict[str, Any], *, expires_s: float | None = None, argsrepr: str = ""
) -> None:
    """Put the Celery task message on the node's queue: the bytes `send_task` would write, for a third of its CPU
    (workers/internals/celery_wire.py); the agent's Celery worker consumes it as any task."""
    celery_wire.publish(_broker(), task, [envelope], queue=queue, expires_s=expires_s, argsrepr=argsrepr)
