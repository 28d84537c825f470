"""The leader's sweep over jobs on nodes (lost nodes, lost launches, overdue jobs, lost stops), and stopping the
jobs of an ended reservation."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils import timezone

from apps.jobs import conf
from apps.jobs.models import ON_NODE_STATES, Job, JobReason, JobState
from apps.jobs.services.starting import job_resend_launch
from apps.jobs.services.transitions import job_fail_launch, job_mark_lost, job_request_stop


def jobs_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Lost nodes, lost launches, overdue jobs; idempotent (the leader runs it every pass, beat as a backstop).

    - starting/running on a node whose heartbeat is older than conf.NODE_LOST_TIMEOUT_S (or that is offline and
      silent that long): lost, GPUs freed from the last heartbeat;
    - starting and not acknowledged: the launch is re-sent every conf.LAUNCH_RESEND_S, and the job fails with
      launch_error after conf.LAUNCH_TIMEOUT_S;
    - running well past max_duration (the node's own timeout did not fire): a stop with reason timeout;
    - asked to stop conf.STOP_RESEND_S ago and still on the node (the command was lost with the broker, or the
      agent refused it as too old): asked again, with the same reason.
    """
    now = now or timezone.now()
    counts = {"lost": 0, "resent": 0, "launch_failed": 0, "overdue": 0, "stop_resent": 0}
    cutoff = now - timedelta(seconds=conf.NODE_LOST_TIMEOUT_S)
    on_nodes = Job.objects.select_related("node").filter(state__in=ON_NODE_STATES)
    for job in on_nodes.filter(node__last_heartbeat__lt=cutoff) | on_nodes.filter(
        node__last_heartbeat__isnull=True, scheduled_at__lt=cutoff
    ):
        node = job.node
        last = node.last_heartbeat if node is not None else None
        end = max(last, job.scheduled_at) if last and job.scheduled_at else (job.scheduled_at or now)
        if job_mark_lost(job=job, message=f"node {node.name if node else '?'} stopped answering", allocation_end=end):
            counts["lost"] += 1
    for job in Job.objects.select_related("node").filter(state=JobState.STARTING, launch_sent_at__isnull=False):
        assert job.launch_sent_at is not None
        age = (now - (job.scheduled_at or job.launch_sent_at)).total_seconds()
        if age > conf.LAUNCH_TIMEOUT_S:
            if job_fail_launch(job=job, message=f"node never acknowledged the launch in {conf.LAUNCH_TIMEOUT_S} s"):
                counts["launch_failed"] += 1
        elif (now - job.launch_sent_at).total_seconds() > conf.LAUNCH_RESEND_S:
            job_resend_launch(job=job)
            counts["resent"] += 1
    overdue_before = now - timedelta(seconds=conf.ALLOCATION_SLACK_S)
    for job in Job.objects.select_related("node").filter(state=JobState.RUNNING, stop_requested_at__isnull=True):
        if job.started_at and job.started_at + timedelta(seconds=job.max_duration_s) < overdue_before:
            job_request_stop(job=job, reason=JobReason.TIMEOUT, grace_s=conf.CANCEL_GRACE_S)
            counts["overdue"] += 1
    stop_again = now - timedelta(seconds=conf.STOP_RESEND_S)
    for job in Job.objects.select_related("node").filter(state__in=ON_NODE_STATES, stop_requested_at__lt=stop_again):
        job_request_stop(job=job, reason=job.stop_reason or JobReason.CANCELLED, grace_s=conf.CANCEL_GRACE_S)
        counts["stop_resent"] += 1
    return counts


def jobs_stop_for_reservation(*, reservation_id: int, team_id: int, gpu_ids: Sequence[int]) -> list[int]:
    """Stop the team's jobs still on the reservation's GPUs (called after its grace period); they end preempted."""
    jobs = (
        Job.objects.select_related("node")
        .filter(team_id=team_id, reservation_id=reservation_id, state__in=ON_NODE_STATES, gpus__id__in=list(gpu_ids))
        .distinct()
    )
    stopped: list[int] = []
    for job in jobs:
        job_request_stop(job=job, reason=JobReason.PREEMPTED, grace_s=conf.CANCEL_GRACE_S)
        stopped.append(job.pk)
    return stopped
