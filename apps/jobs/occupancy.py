"""The jobs app's only door into booking: GPU allocations (the shared occupancy table) and quota holds.

Why one module: booking owns the table and its invariants (`allocations_create` maps an overlap to Conflict; the
PostgreSQL exclusion constraint is the last guard) and the quota arithmetic; jobs only say "this job holds these
GPUs from t0 to t1", "it ended at t", "count it against the quota". Call inside the caller's transaction.
Lock order (booking's): the team's QuotaUsage rows first, then the GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from apps.booking import live as booking_live
from apps.booking import services as booking
from apps.booking.models import AllocationKind, Quota
from apps.booking.services import devices as booking_devices
from apps.core import ttlcache
from apps.core.errors import ValidationFailed
from apps.fleet.models import Gpu, GpuModel
from apps.jobs import conf

if TYPE_CHECKING:
    from apps.jobs.models import Job


def allocate(*, job: Job, gpus: Sequence[Gpu], start: datetime, end: datetime, savepoint: bool = True) -> None:
    """Book `gpus` for the job over [start, end) after the team's concurrent-GPU quota check.

    Raises Conflict if any GPU is already held then (savepoint: the caller may go on; `savepoint=False` for a
    caller with its own), QuotaExceeded if the team would hold more GPUs at once than its quota allows."""
    if team_limits_concurrency(job.team_id):
        # A part of a GPU counts its fraction (`Gpu.capacity`), as billing charges it.
        held = sum((Decimal(g.capacity) for g in gpus), Decimal(0))
        booking.quota_concurrency_check(team=job.team, start=start, end=end, gpu_count=held)
    booking.allocations_create(
        gpus=list(gpus),
        team=job.team,
        user=job.user,
        kind=AllocationKind.JOB,
        job_id=job.pk,
        start=start,
        end=end,
        savepoint=savepoint,
    )
    booking_live.announce_on_commit(team_id=job.team_id, start=start, end=end, kind="job")


def announce_started(jobs: Sequence[Job], *, start: datetime) -> None:
    """Tell open Book pages (after commit) that these jobs, just given GPUs from `start` outside any reservation,
    hold them now: one message per team, over the longest of its jobs' windows (a scheduler pass starts many)."""
    ends: dict[int, datetime] = {}
    for job in jobs:
        end = start + timedelta(seconds=job.max_duration_s + conf.ALLOCATION_SLACK_S)
        ends[job.team_id] = max(end, ends.get(job.team_id, end))
    for team_id, end in ends.items():
        booking_live.announce_on_commit(team_id=team_id, start=start, end=end, kind="job")


# Team id -> whether any of its quotas caps concurrent GPUs.
_limits_concurrency = ttlcache.TTLCache[int, bool](ttl_s=5.0)


def team_limits_concurrency(team_id: int) -> bool:
    """Whether any quota of the team caps concurrent GPUs (cached a few seconds: the scheduler asks per start).

    Teams without such a cap skip booking's concurrency check, which locks the team's usage rows."""
    return _limits_concurrency.get_or_set(
        team_id, lambda: Quota.objects.filter(team_id=team_id, max_concurrent_gpus__isnull=False).exists()
    )


def release(*, job: Job, end: datetime) -> None:
    """Cut the job's allocations at `end`: the GPUs are free from then on (idempotent)."""
    if booking.allocations_end_of_job(job_id=job.pk, at=end):
        # Held until [scheduled_at + its limit + slack] (apps.jobs.services.starting): free from `end` to there.
        held_until = (job.scheduled_at or end) + timedelta(seconds=job.max_duration_s + conf.ALLOCATION_SLACK_S)
        booking_live.announce_on_commit(team_id=job.team_id, start=end, end=max(end, held_until), kind="job")


# Sorted model names -> (their ids, the dearest one's hourly price).
_models = ttlcache.TTLCache[tuple[str, ...], tuple[list[int], Decimal]](ttl_s=5.0)


def _models_facts(gpu_models: Sequence[str]) -> tuple[list[int], Decimal]:
    """(ids of these models, the dearest one's hourly price); all models for []. Cached for a few seconds: every
    submission asks, and a price an admin changes applies to holds from then on."""

    def read() -> tuple[list[int], Decimal]:
        qs = GpuModel.objects.all()
        if gpu_models:
            qs = qs.filter(name__in=list(gpu_models))
        rows = list(qs.values_list("pk", "hourly_price"))
        ids = [pk for pk, _ in rows] if gpu_models else []
        return ids, max((price for _, price in rows), default=Decimal("0"))

    return _models.get_or_set(tuple(sorted(gpu_models)), read)


def hourly_rate(*, gpu_models: Sequence[str], gpu_count: Decimal | int) -> Decimal:
    """What the job's GPUs cost per hour at most: the dearest acceptable model x the GPU count (a part of a GPU:
    its fraction), to the 4 places a quota hold stores it with."""
    return (_models_facts(gpu_models)[1] * gpu_count).quantize(Decimal("0.0001"))


def quota_hold(*, job: Job, start: datetime, end: datetime, quotas: Mapping[date, Any] | None = None) -> None:
    """Count the job's max duration against its team's quota (QuotaExceeded / model_not_allowed if it does not fit).

    The concurrent-GPU limit is checked when the job is placed (a queued job holds no GPU). Call it inside the
    submission's transaction: a refusal is raised through it and undoes the whole submission."""
    model_ids = _models_facts(job.gpu_models)[0]
    # A job on a share or a MIG instance counts its fraction of a GPU, in GPU-hours and cost alike.
    profile = job.mig_profile
    if not profile and job.mig_memory_mib is not None:
        # Asked by memory: counted as the smallest profile that has it, the one it takes when that one is free.
        # With no such instance in the fleet yet (demo data before its agents), it counts as a whole GPU.
        try:
            profile = booking_devices.profiles_with_memory(job.mig_memory_mib)[0]
        except ValidationFailed:
            profile = ""
    gpus = booking.quota_gpus(gpu_count=job.gpu_count, mig_profile=profile, gpu_share=job.gpu_share)
    booking.quota_check_and_hold(
        team=job.team,
        gpu_count=job.gpu_count,
        gpus=gpus,
        start=start,
        end=end,
        hourly_rate=hourly_rate(gpu_models=job.gpu_models, gpu_count=gpus),
        kind=AllocationKind.JOB,
        gpu_model_ids=model_ids,
        job_id=job.pk,
        check_concurrency=False,
        quotas=quotas,
        savepoint=False,  # job_submit's transaction: a refusal ends it, nothing to keep
    )


def quota_fit_to_profile(*, job: Job) -> None:
    """A job that asked for any MIG instance with enough memory was held as the smallest profile with it; once it
    is placed (`job.mig_profile` set to what it got: a bigger one when the smallest were all taken), it counts
    that profile, as billing charges it. Inside the start's transaction."""
    gpus = booking.quota_gpus(gpu_count=job.gpu_count, mig_profile=job.mig_profile)
    booking.quota_hold_update(job_id=job.pk, gpus=gpus)


def quota_settle(*, job: Job, start: datetime | None, end: datetime | None) -> None:
    """Replace the job's hold by what it really used ([start, end)); give it all back if it never ran."""
    if start is None or end is None or end <= start:
        booking.quota_hold_release(job_id=job.pk)
    else:
        booking.quota_hold_update(job_id=job.pk, start=start, end=end)


def forget_caches() -> None:
    """Drop this process's cached facts (tests; an admin change is otherwise seen within seconds). Every such cache
    is a TTLCache, so this drops all of them, the submission's fleet shape included."""
    ttlcache.clear_all()
