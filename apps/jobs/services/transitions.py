"""The job state machine: the one transition function, and the moves built on it (cancel, stop, lost, failed).

Every state change goes through `job_transition`, a conditional UPDATE on the current state: two racing
transitions (a cancel and an exit report, two copies of one report) cannot both win, and an illegal move
(`succeeded → running`) is refused. Broadcasts and scheduler wake-ups happen after commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.types import User
from apps.core.errors import Conflict, Forbidden, NotFound, ValidationFailed
from apps.jobs import conf, events, occupancy
from apps.jobs.models import ON_NODE_STATES, TERMINAL_STATES, TRANSITIONS, Job, JobEvent, JobReason, JobState


class TransitionRefused(Conflict):
    """The job is not in a state from which this move is legal (or another transition got there first)."""

    code = "illegal_transition"


def clamp(at: datetime | None, lo: datetime | None, hi: datetime) -> datetime:
    """A node's timestamp, kept inside what the portal knows is possible (clocks drift)."""
    value = at or hi
    if lo is not None and value < lo:
        value = lo
    return min(value, hi)


def job_transition(
    job: Job,
    to_state: str,
    *,
    reason: str = "",
    exit_code: int | None = None,
    message: str = "",
    at: datetime | None = None,
    allocation_end: datetime | None = None,
    update: Mapping[str, Any] | None = None,
    savepoint: bool = True,
) -> Job:
    """Move `job` to `to_state`, or raise TransitionRefused.

    A conditional UPDATE ... WHERE state = <current>: under concurrency exactly one of two racing transitions
    changes the row; the loser re-reads the state and is refused unless the move is still legal from there.
    In the same transaction: a JobEvent, timestamps, and for a final state the allocations cut at the end
    (`allocation_end`, e.g. the node's last heartbeat for a lost job) and the quota settled to the real runtime.
    After commit: a websocket broadcast and, for a final state, a scheduler wake-up.
    Nested in a caller's transaction it runs in a savepoint (the caller may catch a refusal and go on);
    `savepoint=False` for a caller with its own savepoint around this call (two round trips less).
    """
    if to_state not in JobState.values:
        raise ValidationFailed(f"Unknown state {to_state!r}.")
    now = timezone.now()
    with transaction.atomic(savepoint=savepoint):
        current = job.state
        for _ in range(3):
            if to_state not in TRANSITIONS.get(current, frozenset()):
                raise TransitionRefused(f"Job {job.pk} is {current}; it cannot become {to_state}.")
            fields: dict[str, Any] = {"state": to_state, "updated_at": now, **(update or {})}
            if to_state == JobState.RUNNING:
                fields["started_at"] = clamp(at, job.scheduled_at, now)
            if to_state in TERMINAL_STATES:
                started = fields.get("started_at", job.started_at)
                fields["ended_at"] = clamp(at, started or job.scheduled_at, now)
                fields["reason"] = reason
                fields["exit_code"] = exit_code
                fields["message"] = message[:4000]
                fields["pending_reason"] = ""
                fields["pending_message"] = ""
                if started is None and to_state != JobState.LOST and job.scheduled_at is not None:
                    # It ended before the "started" report arrived: count it as started when scheduled.
                    fields["started_at"] = job.scheduled_at
            if Job.objects.filter(pk=job.pk, state=current).update(**fields) == 1:
                break
            # Someone else moved it: re-read the whole row (the next attempt computes from fresh values).
            try:
                job.refresh_from_db()
            except Job.DoesNotExist:
                raise NotFound(f"Job {job.pk} no longer exists.") from None
            current = job.state
        else:
            raise TransitionRefused(f"Job {job.pk} changed state concurrently; try again.")
        for name, value in fields.items():
            setattr(job, name, value)
        timeline = []
        if current == JobState.STARTING and to_state in TERMINAL_STATES and job.started_at is not None:
            # It ran (briefly) before anyone heard it had started: the timeline says so.
            timeline.append(JobEvent(job=job, at=job.started_at, from_state=current, to_state=JobState.RUNNING))
            current = JobState.RUNNING
        timeline.append(
            JobEvent(job=job, at=now, from_state=current, to_state=to_state, reason=reason, message=message[:4000])
        )
        JobEvent.objects.bulk_create(timeline)
        if to_state in TERMINAL_STATES:
            end = job.ended_at or now
            if allocation_end is not None:
                end = allocation_end
            occupancy.release(job=job, end=max(end, job.scheduled_at or end))
            if job.reservation_id is None:
                occupancy.quota_settle(job=job, start=job.started_at, end=job.ended_at if job.started_at else None)
            events.wake_scheduler_on_commit("ended")
        events.broadcast_state_on_commit(job)
        events.publish_state(job)
    return job


def job_request_stop(*, job: Job, reason: str, grace_s: float) -> None:
    """Ask the job's node to stop it (SIGTERM, grace, SIGKILL); the node's exit report ends it."""
    from apps.fleet.commands import agent_send

    with transaction.atomic():
        Job.objects.filter(pk=job.pk, state__in=ON_NODE_STATES).update(
            stop_reason=reason, stop_requested_at=timezone.now()
        )
        if job.node is not None:
            agent_send(node=job.node, task="agent.cancel_job", body={"job_id": job.pk, "grace_s": float(grace_s)})


def job_cancel(*, job: Job, user: User) -> Job:
    """Cancel a job: a queued one at once; one on a node is stopped there and ends when the node says so.

    The user must be the submitter, a manager of the team, or staff (teammates may watch, not cancel).
    Cancelling a finished job is refused (409); cancelling twice is harmless.
    """
    from apps.accounts.scoping import managed_team_ids_of

    if not (user.is_staff or job.user_id == user.pk or job.team_id in managed_team_ids_of(user)):
        raise Forbidden("Only the submitter, a team manager or an admin may cancel this job.")
    if job.state == JobState.QUEUED:
        try:
            return job_transition(job, JobState.CANCELLED, reason=JobReason.CANCELLED, message=f"cancelled by {user}")
        except TransitionRefused:
            job.refresh_from_db()
    if job.state in ON_NODE_STATES:
        job_request_stop(job=job, reason=JobReason.CANCELLED, grace_s=conf.CANCEL_GRACE_S)
        job.refresh_from_db()
        return job
    raise Conflict(f"Job {job.pk} has already ended ({job.state}).", code="job_finished")


def job_mark_lost(*, job: Job, message: str, allocation_end: datetime | None) -> bool:
    """starting/running → lost (node_lost); the GPUs are free from `allocation_end` (the last heartbeat)."""
    try:
        job_transition(job, JobState.LOST, reason=JobReason.NODE_LOST, message=message, allocation_end=allocation_end)
    except TransitionRefused:
        return False
    return True


def job_fail_launch(*, job: Job, message: str) -> bool:
    """starting → failed (launch_error): the node never acknowledged the launch."""
    try:
        job_transition(job, JobState.FAILED, reason=JobReason.LAUNCH_ERROR, message=message)
    except TransitionRefused:
        return False
    return True
