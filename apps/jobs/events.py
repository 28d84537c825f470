"""Side effects after commit: websocket broadcasts to a job's group (through `apps.core.broadcast`, which sends only
to groups someone watches), and waking the scheduler.

Both are best effort: a broadcast lost while Redis restarts costs a live view a message (the page re-reads on
reconnect), a lost wake-up costs at most one scheduler interval (the leader passes every second anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from apps.core import broadcast
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


def _group_send(job_id: int, message: dict[str, Any]) -> None:
    broadcast.send(group_name(job_id), {"type": "job.message", "message": message})


# The Jobs list (`/ws/jobs/`, JobListConsumer) hears of every state change of its viewer's teams' jobs (admins:
# all jobs) through one group per team and one for admins.
LIST_GROUP_ALL = "jobs.all"


def list_group(team_id: int) -> str:
    return f"jobs.team.{team_id}"


def _list_sender(job: Job) -> Callable[[], None]:
    """Sends, when called, the job's state as it is now to the Jobs lists that may show it."""
    team_group = list_group(job.team_id)
    changed = {"type": "jobs.changed", "data": {"job": job.pk, "state": job.state}}

    def send() -> None:
        broadcast.send(team_group, changed)
        broadcast.send(LIST_GROUP_ALL, changed)

    return send


def broadcast_state_on_commit(job: Job) -> None:
    message = state_message(job)
    to_lists = _list_sender(job)

    def send() -> None:
        _group_send(job.pk, message)
        to_lists()

    transaction.on_commit(send)


def broadcast_submitted_on_commit(job: Job) -> None:
    """A new job: only the Jobs lists can be watching it."""
    transaction.on_commit(_list_sender(job))


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
