"""Planned starts for jobs on parts (MIG instances, shares) that do not fit now: backfill for parts.

Why: without a plan, a job that needs two shares of one GPU (half of it) waits while each share that frees goes to
the next quarter-GPU job, for as long as quarters keep coming; and a job told nothing cannot tell a short wait from
a stuck one. As the core does for the head of the whole-GPU queue, a job that does not fit is planned on the parts
that come free first for its whole estimate; jobs after it in the order may take those parts only if they end by
then.

The plans are computed in memory, from the parts and what holds them (allocations, maintenance windows), read
once per pass and kind of part, with booking's own best fit (`apps.booking.placement`): trying a job at each time
parts come free with a placement query each cost a pass 2-4 ms per try (docs/benchmarks.md). A plan is an
estimate: the start itself still goes through booking's placement and the allocation constraint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from apps.booking.placement import FreeUnit, place_instances, place_share, shares_needed
from apps.booking.services.devices import Hold, holds_after, live_parts, profiles_with_memory
from apps.booking.services.gpus import GpuInfo
from apps.core.errors import ApplicationError
from apps.fleet.models import DeviceKind, GpuModel, Node, PoolBackend
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import ReasonCode, span

logger = logging.getLogger(__name__)

MAX_PLANS = 16  # waiting jobs on parts given a planned start per pass; the rest wait behind them
PLAN_HORIZON = 256  # the times at which parts come free that a plan tries

Shape = tuple[object, ...]  # what a job asks for (part, models, count): jobs of one shape compete for the same parts


@dataclass(frozen=True)
class Plan:
    """Parts planned for a waiting job from `start` on: later jobs may take them only if they end by then."""

    start: datetime
    parts: frozenset[int]
    shape: Shape


@dataclass
class _Parts:
    """The live parts of one kind (and profile, and model) and what holds them or their GPUs after now."""

    units: list[tuple[GpuInfo, int, int]]  # (part, its GPU's id, that GPU's shares)
    holds: dict[int, list[Hold]]  # by part or GPU id
    node_holds: dict[int, list[Hold]]  # maintenance of a node
    fleet_holds: list[Hold]  # maintenance of the whole fleet
    times: list[datetime]  # when any of them ends, earliest first


@dataclass
class PartPlanner:
    """The plans of one scheduler pass, in the order the jobs were offered."""

    now: datetime
    plans: list[Plan] = field(default_factory=list)
    _loaded: dict[tuple[str, str, int | None], _Parts] = field(default_factory=dict)
    _foreign_nodes: set[int] | None = None

    def kept_until(self, end: datetime) -> set[int]:
        """Parts planned for jobs ahead that a job running until `end` would still hold when they are due."""
        return {part for plan in self.plans if plan.start < end for part in plan.parts}

    def plan_or_wait(
        self, job: Job, model: GpuModel | None, shape: Shape, *, duration: timedelta, detail: str | None
    ) -> None:
        """Plan the earliest start of a job that does not fit now and tell the job when; or, when no plan is found
        within the horizon (or enough jobs ahead already have one), tell it why it waits."""
        what = asked(job)
        found: tuple[datetime, GpuInfo] | None = None
        if len(self.plans) < MAX_PLANS:
            try:
                found = self._earliest(job, model, shape, duration)
            except Exception:  # a plan is advice: a fault in it must not stop the pass from starting jobs
                logger.exception("planning the start of job %s failed", job.pk)
        if found is not None:
            at, part = found
            code = ReasonCode.NEXT_IN_LINE
            when = span((at - self.now).total_seconds())
            message = f"next in line: {what} on GPU {part.parent_index} of {part.node} is planned for it in {when}"
            message += " at the latest"
        else:
            code = ReasonCode.WAITING_FOR_GPUS
            message = f"waiting for {what}: " + (detail or "none is free now, and jobs ahead of it wait for one too")
        say(job, code, message)

    def _earliest(
        self, job: Job, model: GpuModel | None, shape: Shape, duration: timedelta
    ) -> tuple[datetime, GpuInfo] | None:
        """The first time the job's part comes free for its whole duration, outside the parts planned for jobs
        ahead; the plan is kept."""
        model_id = model.pk if model is not None else None
        if job.gpu_share is not None:
            kinds = [(DeviceKind.SHARE.value, "")]
        else:
            try:
                profiles = [job.mig_profile] if job.mig_profile else []
                if not profiles and job.mig_memory_mib:
                    profiles = profiles_with_memory(job.mig_memory_mib, model_id=model_id)
            except ApplicationError:
                return None  # no instance in the fleet has that memory any more: nothing to plan
            kinds = [(DeviceKind.MIG.value, p) for p in profiles]
        loaded = [self._load(kind, profile, model_id) for kind, profile in kinds]
        planned = {part for plan in self.plans for part in plan.parts}
        foreign = self._foreign()
        times = sorted({t for parts in loaded for t in parts.times})[:PLAN_HORIZON]
        for at in times:
            end = at + duration
            for parts in loaded:  # by memory: the smallest profile first, as a start would
                free = [
                    (info, parent, shares)
                    for info, parent, shares in parts.units
                    if info.id not in planned
                    and info.node_id not in foreign
                    and (not job.gpu_models or info.model in job.gpu_models)
                    and _free(parts, info, parent, at, end)
                ]
                picked = _place(job, free)
                if picked:
                    by_id = {info.id: info for info, _, _ in free}
                    self.plans.append(Plan(at, frozenset(picked), shape))
                    return at, by_id[picked[0]]
        return None

    def _load(self, kind: str, profile: str, model_id: int | None) -> _Parts:
        key = (kind, profile, model_id)
        if key not in self._loaded:
            units = live_parts(kind=kind, profile=profile, model_id=model_id, at=self.now)
            ids = {info.id for info, _, _ in units} | {parent for _, parent, _ in units}
            holds: dict[int, list[Hold]] = {}
            node_holds: dict[int, list[Hold]] = {}
            fleet_holds: list[Hold] = []
            for hold in holds_after(self.now, ids):
                if hold.gpu_id is not None:
                    holds.setdefault(hold.gpu_id, []).append(hold)
                elif hold.node_id is not None:
                    node_holds.setdefault(hold.node_id, []).append(hold)
                else:
                    fleet_holds.append(hold)
            ends = _ends(h for group in (*holds.values(), *node_holds.values(), fleet_holds) for h in group)
            self._loaded[key] = _Parts(units, holds, node_holds, fleet_holds, ends)
        return self._loaded[key]

    def _foreign(self) -> set[int]:
        """Nodes of pools the portal's agents do not run (a Slurm pool's GPUs are Slurm's)."""
        if self._foreign_nodes is None:
            self._foreign_nodes = set(
                Node.objects.filter(pool__isnull=False)
                .exclude(pool__backend=PoolBackend.AGENTS)
                .values_list("id", flat=True)
            )
        return self._foreign_nodes


def _ends(holds: Iterable[Hold]) -> list[datetime]:
    return sorted({h.end for h in holds})


def _free(parts: _Parts, info: GpuInfo, parent: int, start: datetime, end: datetime) -> bool:
    """Is nothing holding the part, its GPU, its node or the fleet in [start, end)?"""
    for group in (
        parts.holds.get(info.id, ()),
        parts.holds.get(parent, ()),
        parts.node_holds.get(info.node_id, ()),
        parts.fleet_holds,
    ):
        for hold in group:
            if hold.start < end and hold.end > start:
                return False
    return True


def _place(job: Job, free: list[tuple[GpuInfo, int, int]]) -> list[int] | None:
    """Booking's best fit over the parts free in the window (`place_parts_locked`'s choice, without the query)."""
    units = [FreeUnit(info.id, parent, info.node, info.index) for info, parent, _ in free]
    if job.gpu_share is None:
        return place_instances(units, job.gpu_count)
    totals = {parent: shares for _, parent, shares in free}
    for split in sorted(set(totals.values())):
        need = shares_needed(job.gpu_share, split)
        if need is not None:
            picked = place_share([u for u in units if totals[u.parent] == split], need, totals)
            if picked is not None:
                return picked
    return None


def asked(job: Job) -> str:
    """What a job on a part asks for, in words."""
    if job.gpu_share is not None:
        return f"{job.gpu_share.normalize()} of a shared GPU"
    if job.mig_profile:
        return f"a {job.mig_profile} MIG instance"
    return f"a MIG instance with {job.mig_memory_mib} MiB or more"


def say(job: Job, code: ReasonCode, message: str) -> None:
    """Store why the job waits, only when it changed (most passes change nothing)."""
    message = message[:300]
    if job.pending_reason != code.value or job.pending_message != message:
        Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(pending_reason=code.value, pending_message=message)
