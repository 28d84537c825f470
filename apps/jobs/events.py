"""Side effects after commit: websocket broadcasts to a job's group, and waking the scheduler.

Both are best effort: a broadcast lost while Redis restarts costs a live view a message (the page re-reads on
reconnect), a lost wake-up costs at most one scheduler interval (the leader passes every second anyway).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from apps.events.services import publish

if TYPE_CHECKING:
    from apps.jobs.models import Job

logger = logging.getLogger(__name__)

WAKE_KEY = "jobs:scheduler:wake"
WAKE_MAX = 100


def group_name(job_id: int) -> str:
    return f"job.{job_id}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def state_message(job: Job) -> dict[str, Any]:
    """The websocket message for a job's state (also sent on connect)."""
    return {
        "type": "state",
        "ts": timezone.now().isoformat(),
        "job": job.pk,
        "state": job.state,
        "reason": job.reason or None,
        "exit_code": job.exit_code,
        "message": job.message,
        "node": job.node.name if job.node_id and job.node else None,
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
        "pending_reason": job.pending_reason or None,
        "pending_message": job.pending_message or None,
    }


class _Broadcaster:
    """One event loop thread per process sends the group messages, so a write never waits for Redis.

    async_to_sync per message would build a loop and block the writer (~3 ms each); the scheduler starting fifty
    jobs, or the worker applying a burst of reports, would pay that fifty times. The channel layer is bound to the
    loop that uses it, so all sends go through this one loop. Recreated after a fork (Celery's prefork pool).

    Messages queue up while the loop works and go out in batches, in the order they were committed. A batch first
    asks Redis which of its job groups have a member (one pipelined EXISTS) and sends only to those: most jobs are
    watched by nobody, and a group_send costs two round trips and a task on the loop even for an empty group
    (about a fifth of the scheduler's CPU at 45 jobs/s went to broadcasts). A page that joins a group after the
    check misses nothing: the consumer joins first and then reads the job, which by then has the committed change.
    """

    def __init__(self) -> None:
        self.pid = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.pending: list[tuple[int, dict[str, Any]]] = []
        self.draining = False

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="job-broadcasts", daemon=True).start()
                self.loop, self.pid = loop, os.getpid()
                self.pending, self.draining = [], False
            return self.loop

    def send(self, job_id: int, message: dict[str, Any]) -> None:
        loop = self._ensure()
        with self.lock:
            self.pending.append((job_id, message))
            if self.draining:  # the running drain takes it with its next batch
                return
            self.draining = True
        asyncio.run_coroutine_threadsafe(self._drain(), loop)

    async def _drain(self) -> None:
        # One drain at a time, so a job's messages leave in the order they were queued.
        from channels.layers import get_channel_layer

        while True:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    self.draining = False
                    return
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await _deliver(layer, batch)
            except Exception:  # a batch lost, never the drain: later messages must still go out
                logger.exception("broadcasting %d job messages failed", len(batch))


async def _deliver(layer: Any, batch: list[tuple[int, dict[str, Any]]]) -> None:
    watched = await _watched_groups(layer, {group_name(job_id) for job_id, _ in batch})
    for job_id, message in batch:
        group = group_name(job_id)
        if watched is not None and group not in watched:
            continue
        try:
            await layer.group_send(group, {"type": "job.message", "message": message})
        except Exception as exc:  # a live view missing a message must never fail anything
            logger.warning("broadcast to job %s failed: %s", job_id, exc)


async def _watched_groups(layer: Any, groups: set[str]) -> set[str] | None:
    """The groups with at least one member, or None when that cannot be asked (then every group is sent to)."""
    if not all(hasattr(layer, name) for name in ("_group_key", "consistent_hash", "connection")):
        return None  # not channels-redis's RedisChannelLayer (its group sets are what is asked here)
    by_connection: dict[int, list[str]] = {}
    for group in groups:
        by_connection.setdefault(layer.consistent_hash(group), []).append(group)
    watched: set[str] = set()
    try:
        for index, names in by_connection.items():
            pipe = layer.connection(index).pipeline(transaction=False)
            for name in names:
                pipe.exists(layer._group_key(name))
            for name, present in zip(names, await pipe.execute(), strict=True):
                if present:
                    watched.add(name)
    except Exception as exc:  # Redis away: the sends would fail as well, and say so
        logger.warning("asking which job groups are watched failed: %s", exc)
        return None
    return watched


_broadcaster = _Broadcaster()


def _group_send(job_id: int, message: dict[str, Any]) -> None:
    _broadcaster.send(job_id, message)


def broadcast_state_on_commit(job: Job) -> None:
    message = state_message(job)
    transaction.on_commit(lambda: _group_send(job.pk, message))


def broadcast_logs_on_commit(job_id: int, lines: list[dict[str, Any]]) -> None:
    if not lines:
        return
    message = {"type": "logs", "ts": timezone.now().isoformat(), "job": job_id, "lines": lines}
    transaction.on_commit(lambda: _group_send(job_id, message))


# The job states that are portal events (webhooks, mail): "job.<state>".
PUBLISHED_STATES = frozenset({"queued", "running", "succeeded", "failed", "cancelled", "lost"})


def publish_state(job: Job) -> None:
    """The job's new state as a portal event, written to the outbox in the caller's transaction."""
    if job.state not in PUBLISHED_STATES:
        return
    data: dict[str, object] = {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "reason": job.reason or None,
        "exit_code": job.exit_code,
        "image": job.image,
        "gpu_count": job.gpu_count,
        "submitted_at": _iso(job.submitted_at),
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
    }
    publish(f"job.{job.state}", team_id=job.team_id, subject=f"jobs/{job.pk}", data=data, user_id=job.user_id)


def wake_scheduler_on_commit(reason: str) -> None:
    """Ask the leader for a pass now (job submitted or ended, reservation started or ended)."""

    def push() -> None:
        from apps.core.redis import get_redis

        try:
            # Not MULTI/EXEC: the trim only bounds the list while no scheduler drains it, so it need not be atomic
            # with the push (and the transaction cost a fifth of the call's CPU, twice per job).
            pipe = get_redis().pipeline(transaction=False)
            pipe.lpush(WAKE_KEY, reason)
            pipe.ltrim(WAKE_KEY, 0, WAKE_MAX - 1)
            pipe.execute()
        except Exception as exc:
            logger.warning("could not wake the scheduler (%s): %s", reason, exc)

    transaction.on_commit(push)
