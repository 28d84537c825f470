"""Planned starts for jobs on parts (MIG instances, shares) that do not fit now: backfill for parts.

Why: without a plan, a job that needs two shares of one GPU (half of it) waits while each share that frees goes to
the next quarter-GPU job, for as long as quarters keep coming; and a job told nothing cannot tell a short wait from
a stuck one. As the core does for the head of the whole-GPU queue, a job that does not fit is planned on the parts
that come free first (from the ends of the allocations holding them) for its whole estimate; jobs after it in the
order may take those parts only if they end by then. Placement is booking's (`place_parts_locked`), tried at each
time parts come free, so a plan honours future bookings and maintenance windows as a start would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction

from apps.booking.services.devices import part_free_times, place_parts_locked, profiles_with_memory
from apps.booking.services.gpus import GpuInfo
from apps.core.errors import ApplicationError
from apps.fleet.models import DeviceKind, Gpu, GpuModel
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import ReasonCode, span

MAX_PLANS = 8  # waiting jobs on parts given a planned start per pass; the rest wait behind them
PLAN_HORIZON = 24  # the times at which parts come free that a plan tries

Shape = tuple[object, ...]  # what a job asks for (part, models, count): jobs of one shape compete for the same parts


@dataclass(frozen=True)
class Plan:
    """Parts planned for a waiting job from `start` on: later jobs may take them only if they end by then."""

    start: datetime
    parts: frozenset[int]
    shape: Shape


@dataclass
class PartPlanner:
    """The plans of one scheduler pass, in the order the jobs were offered."""

    now: datetime
    runs_here: Callable[[Job, list[Gpu]], bool]
    plans: list[Plan] = field(default_factory=list)

    def kept_until(self, end: datetime) -> set[int]:
        """Parts planned for jobs ahead that a job running until `end` would still hold when they are due."""
        return {part for plan in self.plans if plan.start < end for part in plan.parts}

    def plan_or_wait(
        self, job: Job, model: GpuModel | None, shape: Shape, *, duration: timedelta, detail: str | None
    ) -> None:
        """Plan the earliest start of a job that does not fit now and tell the job when; or, when no plan is found
        within the horizon (or enough jobs ahead already have one), tell it why it waits."""
        what = _asked(job)
        found = self._earliest(job, model, shape, duration) if len(self.plans) < MAX_PLANS else None
        if found is not None:
            at, part = found
            code = ReasonCode.NEXT_IN_LINE
            when = span((at - self.now).total_seconds())
            message = f"next in line: {what} on GPU {part.parent_index} of {part.node} is planned for it in {when}"
            message += " at the latest"
        else:
            code = ReasonCode.WAITING_FOR_GPUS
            message = f"waiting for {what}: " + (detail or "none is free now, and jobs ahead of it wait for one too")
        _say(job, code, message)

    def _earliest(
        self, job: Job, model: GpuModel | None, shape: Shape, duration: timedelta
    ) -> tuple[datetime, GpuInfo] | None:
        """The first time the job's part comes free for its whole duration, outside the parts planned for jobs
        ahead; the plan is kept. A job of the same shape as one planned before it is tried from that plan's time
        on: the parts free before then are planned already (queues are mostly many jobs of a few shapes, and each
        try is a placement query)."""
        kind = DeviceKind.SHARE if job.gpu_share is not None else DeviceKind.MIG
        model_id = model.pk if model is not None else None
        planned = {part for plan in self.plans for part in plan.parts}
        resume = max((p.start for p in self.plans if p.shape == shape), default=None)
        after = resume - timedelta(microseconds=1) if resume is not None else self.now
        with transaction.atomic():  # the placement locks are transaction-scoped
            try:
                profiles = [job.mig_profile] if job.mig_profile else []
                if not profiles and job.mig_memory_mib:
                    profiles = profiles_with_memory(job.mig_memory_mib, model_id=model_id)
                times = part_free_times(
                    kind=kind, profiles=profiles, model_id=model_id, after=after, limit=PLAN_HORIZON
                )
            except ApplicationError:
                return None  # no instance in the fleet has that memory any more: nothing to plan
            for at in times:
                try:
                    chosen = place_parts_locked(
                        team=job.team,
                        user=job.user,
                        model=model,
                        uuids=[],
                        mig_profile=job.mig_profile or None,
                        mig_memory_mib=job.mig_memory_mib if not job.mig_profile else None,
                        gpu_share=job.gpu_share,
                        count=1 if job.gpu_share is not None else job.gpu_count,
                        start=at,
                        end=at + duration,
                        exclude=planned,
                        explain=False,
                    )
                except ApplicationError:
                    continue
                gpus = list(Gpu.devices.select_related("model", "node__pool").filter(pk__in=[g.id for g in chosen]))
                if self.runs_here(job, gpus):
                    self.plans.append(Plan(at, frozenset(g.id for g in chosen), shape))
                    return at, chosen[0]
        return None


def _asked(job: Job) -> str:
    if job.gpu_share is not None:
        return f"{job.gpu_share.normalize()} of a shared GPU"
    if job.mig_profile:
        return f"a {job.mig_profile} MIG instance"
    return f"a MIG instance with {job.mig_memory_mib} MiB or more"


def _say(job: Job, code: ReasonCode, message: str) -> None:
    """Store why the job waits, only when it changed (most passes change nothing)."""
    message = message[:300]
    if job.pending_reason != code.value or job.pending_message != message:
        Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(pending_reason=code.value, pending_message=message)
