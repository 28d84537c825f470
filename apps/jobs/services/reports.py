"""What nodes report about their jobs: started, exited, log lines, and the inventory that repairs job states.

A node may only report on the jobs the portal placed on it; every report is idempotent (the agent sends again after
a broker outage, and two portal workers may apply copies of one report).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.fleet.models import Node
from apps.jobs import conf, events
from apps.jobs.models import ON_NODE_STATES, Job, JobLogLine, JobReason, JobState, LogStream
from apps.jobs.services.starting import job_resend_launch
from apps.jobs.services.transitions import TransitionRefused, clamp, job_mark_lost, job_transition


def job_on_node(job_id: int, node_id: int) -> Job | None:
    """The job with its node, if the portal placed it on this node (a node may only report on its own jobs)."""
    return Job.objects.select_related("node").filter(pk=job_id, node_id=node_id).first()


def job_report_started(*, node_id: int, job_id: int, handle: str, at: datetime | None) -> str:
    """The node started the job: "running" (applied, or already so), "ignored" (the node's own exit report got
    there first, or the job is not this node's), or "stop" (the portal ended it meanwhile: the caller stops it)."""
    job = job_on_node(job_id, node_id)
    if job is None:
        return "ignored"
    if job.state == JobState.STARTING:
        try:
            job_transition(job, JobState.RUNNING, at=at, update={"handle": handle[:128]})
        except TransitionRefused:
            job.refresh_from_db()
    if job.state in ON_NODE_STATES:
        return "running"
    # Ended by the portal (lost, or cancelled before the node said anything): the process must not run on.
    # Ended by the node's own exit report (it always carries log_total): nothing runs any more.
    return "stop" if job.log_expected is None else "ignored"


OUTCOME_STATES = {"succeeded": JobState.SUCCEEDED, "failed": JobState.FAILED, "cancelled": JobState.CANCELLED}


def final_state_of(job: Job, state: str, reason: str) -> tuple[str, str]:
    """The job's final (state, reason) from the runtime's outcome and why the portal asked it to stop."""
    if state == "cancelled" or reason == "cancelled":
        if job.stop_reason == JobReason.PREEMPTED:
            return JobState.CANCELLED, JobReason.PREEMPTED
        if job.stop_reason == JobReason.TIMEOUT:
            return JobState.FAILED, JobReason.TIMEOUT
        if job.stop_reason == JobReason.IDLE:
            return JobState.CANCELLED, JobReason.IDLE
        return JobState.CANCELLED, JobReason.CANCELLED
    return OUTCOME_STATES.get(state, JobState.FAILED), reason if reason in JobReason.values else JobReason.EXIT_CODE


def job_report_exit(
    *,
    node_id: int,
    job_id: int,
    state: str,
    reason: str,
    exit_code: int | None,
    message: str,
    finished_at: datetime | None,
    log_total: int | None = None,
    started_at: datetime | None = None,
    handle: str = "",
) -> bool:
    """The node says the job ended. Idempotent: a second copy of the report changes nothing.

    `started_at`/`handle` come with it when the job ended before its start was reported (short jobs): the job goes
    from starting straight to its final state, and the timeline still shows when it ran."""
    job = job_on_node(job_id, node_id)
    if job is None:
        return False
    if job.state not in ON_NODE_STATES:
        if log_total is not None and job.log_expected != log_total:
            Job.objects.filter(pk=job.pk).update(log_expected=log_total)
        return False
    final, final_reason = final_state_of(job, state, reason)
    try:
        job_transition(
            job,
            final,
            reason=final_reason,
            exit_code=exit_code,
            message=message,
            at=finished_at,
            update=_exit_update(job, log_total, started_at, handle),
        )
    except TransitionRefused:
        if log_total is not None:
            Job.objects.filter(pk=job.pk).update(log_expected=log_total)
        return False
    return True


def _exit_update(job: Job, log_total: int | None, started_at: datetime | None, handle: str) -> dict[str, Any]:
    update: dict[str, Any] = {}
    if log_total is not None:
        update["log_expected"] = log_total
    if job.state == JobState.STARTING and started_at is not None:
        update["started_at"] = clamp(started_at, job.scheduled_at, timezone.now())
        if handle:
            update["handle"] = handle[:128]
    return update


@dataclass(frozen=True)
class LogLineIn:
    stream: str
    text: str
    at: datetime


def job_logs_append(*, node_id: int, job_id: int, epoch: str, first: int, lines: Sequence[LogLineIn]) -> int:
    """Store a batch of log lines; returns how many were new.

    The agent numbers lines per attachment (`epoch`, from 1) and line n of an epoch is stored at seq
    log_base + n: batches may arrive in any order (two portal workers, or the agent's replay after a broker
    outage) and each line still lands in its place once; lines already stored, or older than the kept window,
    are skipped. A new epoch starts after the highest seq stored. Only the newest conf.MAX_LOG_LINES lines of a
    job are kept. Locks: the job row (every append of a job runs under it, so the check for stored lines holds).
    """
    if not lines:
        return 0
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, node_id=node_id).first()
        if job is None:
            return 0
        if job.log_epoch != epoch:
            base, agent_seq = job.log_seq, 0
        else:
            base, agent_seq = job.log_base, job.log_agent_seq
        lo, hi = base + first, base + first + len(lines) - 1
        floor = job.log_seq - conf.MAX_LOG_LINES  # at or below: trimmed, or about to be
        present: set[int] = set()
        if lo <= job.log_seq:  # late or repeated: some of these places may be taken
            present = set(JobLogLine.objects.filter(job_id=job.pk, seq__range=(lo, hi)).values_list("seq", flat=True))
        rows = []
        # A node's clock ahead of the portal's would make its lines look new to log readers (who wait at a gap
        # behind a new line) and put them in the future on the page: at most now.
        now = timezone.now()
        for offset, line in enumerate(lines):
            seq = lo + offset
            if seq <= floor or seq in present:
                continue
            stream = line.stream if line.stream in LogStream.values else LogStream.STDOUT
            rows.append(
                JobLogLine(
                    job_id=job.pk,
                    seq=seq,
                    stream=stream,
                    at=min(line.at, now),
                    line=line.text[: conf.MAX_LOG_LINE_CHARS],
                )
            )
        last_seq = max(job.log_seq, hi)
        last_agent = max(agent_seq, first + len(lines) - 1)
        if (last_seq, epoch, base, last_agent) != (job.log_seq, job.log_epoch, job.log_base, job.log_agent_seq):
            Job.objects.filter(pk=job.pk).update(
                log_seq=last_seq, log_epoch=epoch, log_base=base, log_agent_seq=last_agent
            )
        if not rows:
            return 0
        JobLogLine.objects.bulk_create(rows)
        if last_seq - conf.MAX_LOG_LINES > 0 and (last_seq // 100) != (job.log_seq // 100):
            # Trim in steps of ~100 lines rather than on every batch.
            JobLogLine.objects.filter(job_id=job.pk, seq__lte=last_seq - conf.MAX_LOG_LINES).delete()
        events.broadcast_logs_on_commit(
            job.pk, [{"seq": r.seq, "stream": r.stream, "line": r.line, "at": r.at.isoformat()} for r in rows]
        )
    return len(rows)


@dataclass(frozen=True)
class InventoryItem:
    """A job the agent has: running on the node, launching (accepted, not started yet), or exited (its exit report
    was sent a moment ago and may not have been applied yet)."""

    job_id: int
    status: str  # "running" | "launching" | "exited"


def node_reconcile(*, node: Node, items: Iterable[InventoryItem], complete: bool) -> dict[str, list[int]]:
    """Repair job states from what a node's agent says it runs (sent at agent start and every so often).

    - a job the portal thinks is on the node but the agent does not have (and did not just launch): lost;
    - a job the agent runs that the portal has ended (cancelled, lost...) or never placed there: stop it;
    - a starting job the agent runs: running.
    Jobs listed as exited are left to their exit report (sent before this inventory, but another worker may still
    be applying it, or it is being sent again after a broker outage). Returns what it did.
    """
    now = timezone.now()
    have = {item.job_id: item.status for item in items}
    done: dict[str, list[int]] = {"lost": [], "stop": [], "running": []}
    placed = list(Job.objects.select_related("node").filter(node=node, state__in=ON_NODE_STATES))
    for job in placed:
        status = have.get(job.pk)
        if status == "exited":
            continue
        if status == "running" and job.state == JobState.STARTING:
            try:
                job_transition(job, JobState.RUNNING)
                done["running"].append(job.pk)
            except TransitionRefused:
                pass
        elif status is None and complete:
            # A starting job may still be on its way to the agent (the launch message is behind this report).
            recent = job.launch_sent_at is not None and now - job.launch_sent_at < timedelta(
                seconds=conf.LAUNCH_RESEND_S
            )
            if job.state == JobState.STARTING and recent:
                continue
            if job.state == JobState.STARTING:
                job_resend_launch(job=job)
                continue
            if job_mark_lost(job=job, message="the node no longer runs it (node restarted?)", allocation_end=now):
                done["lost"].append(job.pk)
    expected = {job.pk for job in placed}
    unknown = [job_id for job_id, status in have.items() if job_id not in expected and status != "exited"]
    if unknown:
        from apps.fleet.commands import agent_send

        with transaction.atomic():
            for job_id in unknown:
                agent_send(
                    node=node, task="agent.cancel_job", body={"job_id": job_id, "grace_s": float(conf.CANCEL_GRACE_S)}
                )
                done["stop"].append(job_id)
    return done
