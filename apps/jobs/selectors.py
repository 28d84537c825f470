"""Reads for jobs: lists, one job, its logs and timeline, the image allow-list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Prefetch, QuerySet

from apps.accounts.types import AnyUser
from apps.billing.models import SourceKind, UsageRecord
from apps.booking.models import Allocation, AllocationKind
from apps.core.errors import NotFound
from apps.fleet.models import Gpu
from apps.jobs import conf
from apps.jobs.models import ContainerImage, Job, JobEvent, JobLogLine, JobState, TeamJobPolicy


def images_visible_to(*, user: AnyUser) -> QuerySet[ContainerImage]:
    return ContainerImage.objects.visible_to(user).filter(enabled=True).order_by("name")


@dataclass(frozen=True)
class SubmissionFacts:
    """What a submission is checked against: the team's job policy (None: installation defaults), the image if
    it is on the allow-list and enabled, and how many jobs the team has queued."""

    policy: TeamJobPolicy | None
    image: ContainerImage | None
    queued: int


def submission_facts(*, team_id: int, image: str) -> SubmissionFacts:
    """The team's policy, the allow-listed image and the team's queue length in one hand-written query: every job
    submission reads them, and three compiled ORM queries cost the web process more CPU than running them."""
    from apps.core import rawsql

    policy_cols = rawsql.columns(TeamJobPolicy, "p")
    image_cols = rawsql.columns(ContainerImage, "i")
    # Table and column names from the models' metadata; team, state and image name are parameters.
    sql = f"SELECT {policy_cols.sql}, {image_cols.sql}, (SELECT COUNT(*) FROM {Job._meta.db_table} j "  # noqa: S608
    sql += "WHERE j.team_id = %s AND j.state = %s) FROM (SELECT 1 AS one) AS x "
    sql += f"LEFT JOIN {TeamJobPolicy._meta.db_table} p ON p.team_id = %s "
    sql += f"LEFT JOIN {ContainerImage._meta.db_table} i ON i.name = %s AND i.enabled = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [team_id, JobState.QUEUED, team_id, image, True])
        row = cursor.fetchone()
    assert row is not None  # the FROM clause always has its one row
    # A LEFT JOIN that found nothing gives NULLs, the primary key's included.
    policy = policy_cols.load(row) if row[policy_cols.pk_index] is not None else None
    found = row[policy_cols.width + image_cols.pk_index] is not None
    image_row = image_cols.load(row, policy_cols.width) if found else None
    return SubmissionFacts(policy=policy, image=image_row, queued=int(row[policy_cols.width + image_cols.width]))


def jobs_visible_to(*, user: AnyUser) -> QuerySet[Job]:
    """The jobs the user may see, newest first (filters: apps.jobs.filtersets.JobFilterSet)."""
    return Job.objects.visible_to(user).select_related("team", "user", "node").order_by("-submitted_at", "-id")


# MIG instances and shares are devices of a job too (`Gpu.objects` would hide them); a part names its GPU.
_DEVICES = Gpu.devices.select_related("model", "node", "parent")


def job_detail_queryset(*, user: AnyUser) -> QuerySet[Job]:
    return (
        Job.objects.visible_to(user)
        .select_related("team", "user", "node")
        .prefetch_related(Prefetch("gpus", queryset=_DEVICES.order_by("index")))
    )


def job_get(*, user: AnyUser, job_id: int) -> Job:
    """One visible job, or NotFound (someone else's job is as absent as a missing one)."""
    job = job_detail_queryset(user=user).filter(pk=job_id).first()
    if job is None:
        raise NotFound("No such job.")
    return job


def job_gpus_used(*, job: Job) -> list[Gpu]:
    """The GPUs the job holds or ran on. `job.gpus` while it is placed; for a job whose placement was not kept
    there, its job allocations, then its ledger rows (a job that ended still shows where it ran)."""
    gpus = list(job.gpus.all())  # the prefetched devices (job_detail_queryset), or a query for them
    if gpus or job.started_at is None:
        return gpus
    ids = set(Allocation.objects.filter(kind=AllocationKind.JOB, job_id=job.pk).values_list("gpu_id", flat=True))
    if not ids:
        ids = set(UsageRecord.objects.filter(source=SourceKind.JOB, source_id=job.pk).values_list("gpu_id", flat=True))
    return list(_DEVICES.filter(pk__in=ids).order_by("node__name", "index"))


def job_events(*, job: Job) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job).order_by("at", "id")


def job_log_lines(*, job: Job, after: int = 0, limit: int = 1000) -> list[JobLogLine]:
    """Lines with seq > after, oldest first, at most `limit`."""
    return list(JobLogLine.objects.filter(job=job, seq__gt=after).order_by("seq")[:limit])


@dataclass(frozen=True)
class LogPage:
    lines: list[JobLogLine]
    last_seq: int  # the cursor for the next read (`after`)
    waiting: bool  # lines after a missing one are stored but held back: read again shortly


def job_log_page(*, job: Job, after: int, limit: int, now: datetime) -> LogPage:
    """The lines a follower may take now: seq > after, oldest first, at most `limit`, stopping before a line that
    follows a missing one unless it is `conf.LOG_GAP_WAIT_S` old.

    Lines are stored at their place in the job's output, and a batch can arrive after a later one: a reader that
    took line 5 and moved its cursor past a missing line 4 would never see 4. Holding the rest back a few seconds
    lets the late batch land first; a gap that stays (lines the agent dropped) is passed after the wait. Places at
    or below the kept window's floor are not waited for (trimmed, and a late line there is not stored)."""
    rows = job_log_lines(job=job, after=after, limit=limit)
    floor = max(after, job.log_seq - conf.MAX_LOG_LINES)
    fresh = now - timedelta(seconds=conf.LOG_GAP_WAIT_S)
    expected = after + 1
    taken: list[JobLogLine] = []
    for row in rows:
        if row.seq > max(expected, floor + 1) and row.at > fresh:
            return LogPage(lines=taken, last_seq=taken[-1].seq if taken else max(after, 0), waiting=True)
        taken.append(row)
        expected = row.seq + 1
    return LogPage(lines=taken, last_seq=taken[-1].seq if taken else max(after, 0), waiting=False)
