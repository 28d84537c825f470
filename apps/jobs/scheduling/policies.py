"""Scheduling policies: in which order the queue is offered to placement, and whether backfill is on.

- ``fifo``: strict arrival order; the first job that cannot start blocks everything behind it.
- ``backfill``: arrival order plus EASY backfill: the first job that cannot start gets a planned (shadow)
  start at its earliest possible time; later jobs may start now only if they do not delay it.
- ``fair`` (default): priority first; within a priority level jobs are ordered by a *virtual submission
  time*: ``submitted_at + size penalty + team penalty``. The size penalty (short jobs first) grows with the
  job's estimated GPU-seconds on a log scale; the team penalty grows with the team's decayed usage against
  its share (plus the GPUs it holds right now, updated as the pass starts jobs, so two teams submitting at
  once are interleaved). Both penalties are bounded, which is the ageing rule: a job can be overtaken only
  by jobs submitted at most ``size_weight_s + fairshare_weight_s`` after it, so no job waits forever behind a
  stream of short ones. Always with backfill; the top of the fair order gets the shadow reservation.

Why virtual time rather than a weighted sum: the bound on overtaking is explicit in seconds, one knob per
concern, and the order within a team does not change while a pass runs, so a heap over teams (not over
jobs) keeps the dynamic team penalty cheap.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from apps.jobs.scheduling.fairshare import fairshare_penalty
from apps.jobs.scheduling.model import PendingJob


@dataclass(frozen=True, slots=True)
class Policy:
    """How a pass orders the queue. The weights only matter when ``fair_order`` is set."""

    name: str
    fair_order: bool = True
    backfill: bool = True
    size_weight_s: float = 24 * 3600.0
    """Head start (seconds of submission time) the smallest job gets over a job of ``size_cap_gpu_s``."""
    size_ref_gpu_s: float = 600.0
    """Jobs up to about this many GPU-seconds count as small (the penalty grows with log(1 + x / ref))."""
    size_cap_gpu_s: float = 30 * 24 * 3600.0
    """GPU-seconds at which the size penalty reaches ``size_weight_s``."""
    fairshare_weight_s: float = 2 * 3600.0
    """Head start an idle team gets over a team far above its share."""
    held_gpu_weight_s: float = 3600.0
    """Each GPU a team holds now counts as this many GPU-seconds of extra usage."""
    default_share: float = 1.0
    """Share of a team missing from ``Snapshot.team_shares``."""
    gang_nodes_kept: float = 0.0
    """Share of the multi-GPU nodes kept clear of long work that leaves part of a node, for gangs (rounded
    down; ``longwork``). 0, the default, turns the rule off: it trades small jobs' waits for gangs' (see
    docs/benchmarks.md, "Keeping nodes clear of long work")."""
    long_job_s: float = 24 * 3600.0
    """A job estimated to run at least this long is long work."""
    long_job_patience_s: float = 3600.0
    """How long such a job waits for room where long work already is before it may take any node."""

    def __post_init__(self) -> None:
        if self.size_weight_s < 0.0 or self.fairshare_weight_s < 0.0 or self.held_gpu_weight_s < 0.0:
            raise ValueError("the fair order's weights cannot be negative")
        if not 0.0 <= self.gang_nodes_kept < 1.0:
            raise ValueError("gang_nodes_kept is a share of the nodes: at least 0 and below 1")
        if self.long_job_s < 0.0:
            raise ValueError("long_job_s cannot be negative")
        if self.long_job_patience_s < 0.0:
            raise ValueError("long_job_patience_s cannot be negative")


FIFO = Policy("fifo", fair_order=False, backfill=False)
BACKFILL = Policy("backfill", fair_order=False, backfill=True)
FAIR = Policy("fair")

POLICIES: Mapping[str, Policy] = {p.name: p for p in (FIFO, BACKFILL, FAIR)}


def policy_by_name(name: str) -> Policy:
    """The built-in policy called ``name`` (fifo, backfill, fair)."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def size_penalty(job: PendingJob, policy: Policy) -> float:
    """Seconds of submission time a job loses for being big (short estimates first)."""
    gpu_s = max(job.gpu_count, 1) * max(job.max_duration_s, 0.0)
    scale = math.log1p(policy.size_cap_gpu_s / policy.size_ref_gpu_s)
    return policy.size_weight_s * min(math.log1p(gpu_s / policy.size_ref_gpu_s) / scale, 1.0)


class JobQueue(Protocol):
    """Offers pending jobs one at a time; told which of them started."""

    def pop(self) -> PendingJob | None:
        """The next job to try, or None when the queue is exhausted."""
        ...

    def started(self, job: PendingJob) -> None:
        """``job`` (the last one popped) was started in this pass."""
        ...


def arrival_key(job: PendingJob) -> tuple[float, str]:
    """Strict arrival order; the id breaks ties so the order never depends on input order."""
    return (job.submitted_at, job.id)


class ArrivalQueue:
    """Jobs in arrival order (fifo, backfill)."""

    def __init__(self, jobs: Iterable[PendingJob]) -> None:
        self._jobs = sorted(jobs, key=arrival_key)
        self._next = 0

    def pop(self) -> PendingJob | None:
        """The next job in arrival order."""
        if self._next >= len(self._jobs):
            return None
        job = self._jobs[self._next]
        self._next += 1
        return job

    def started(self, job: PendingJob) -> None:
        """Arrival order does not depend on what started."""

    def rest(self) -> Sequence[PendingJob]:
        """The jobs not popped yet."""
        return self._jobs[self._next :]


class FairQueue:
    """Jobs in fair order: one sorted list per team, merged through a heap keyed by each team's best job.

    A team's penalty is fixed for the jobs already in the heap and recomputed when the team's next job is
    pushed, after ``started`` charged it for the GPUs it just took.
    """

    def __init__(
        self,
        jobs: Iterable[PendingJob],
        policy: Policy,
        *,
        usage: Mapping[str, float],
        shares: Mapping[str, float],
        held_gpus: Mapping[str, int],
    ) -> None:
        self._policy = policy
        per_team: dict[str, list[tuple[int, float, float, str, PendingJob]]] = {}
        for job in jobs:
            base = job.submitted_at + size_penalty(job, policy)
            per_team.setdefault(job.team, []).append((-job.priority, base, job.submitted_at, job.id, job))
        for entries in per_team.values():
            entries.sort(key=lambda e: e[:4])
        self._per_team = per_team
        self._pos = dict.fromkeys(per_team, 0)
        # Sorted so that float sums do not depend on set iteration order (string hashes vary per process).
        teams = sorted(set(per_team) | set(usage) | set(shares) | set(held_gpus))
        self._usage = {t: max(usage.get(t, 0.0), 0.0) + held_gpus.get(t, 0) * policy.held_gpu_weight_s for t in teams}
        share_of = {t: max(shares.get(t, policy.default_share), 0.0) for t in teams}
        total_share = sum(share_of.values()) or 1.0
        self._share = {t: share_of[t] / total_share for t in teams}
        # Normalised against the total at the start of the pass, so charging one team does not re-rank the
        # others mid-pass; the one-GPU-hour floor keeps an idle fleet's first start from looking infinite.
        self._total = sum(self._usage.values()) + max(policy.held_gpu_weight_s, 1.0)
        self._heap: list[tuple[int, float, float, str, str]] = []
        self._refill: str | None = None
        for team in sorted(per_team):
            self._push(team)

    def team_penalty(self, team: str) -> float:
        """Seconds of submission time the team's jobs lose for its usage against its share."""
        share = self._share.get(team, 0.0)
        ratio = self._usage.get(team, 0.0) / (self._total * share) if share > 0.0 else math.inf
        return self._policy.fairshare_weight_s * fairshare_penalty(ratio)

    def _push(self, team: str) -> None:
        pos = self._pos[team]
        entries = self._per_team[team]
        if pos < len(entries):
            neg_priority, base, submitted_at, job_id, _ = entries[pos]
            heapq.heappush(self._heap, (neg_priority, base + self.team_penalty(team), submitted_at, job_id, team))

    def pop(self) -> PendingJob | None:
        """The job with the smallest (-priority, virtual submission time, submitted_at, id)."""
        if self._refill is not None:
            self._push(self._refill)
            self._refill = None
        if not self._heap:
            return None
        team = heapq.heappop(self._heap)[-1]
        job = self._per_team[team][self._pos[team]][-1]
        self._pos[team] += 1
        self._refill = team
        return job

    def started(self, job: PendingJob) -> None:
        """Charge the team for the GPUs it just took, before its next job is ranked."""
        self._usage[job.team] = self._usage.get(job.team, 0.0) + job.gpu_count * self._policy.held_gpu_weight_s

    def rest(self) -> Sequence[PendingJob]:
        """The jobs not popped yet, in no particular order."""
        return [e[-1] for team, entries in self._per_team.items() for e in entries[self._pos[team] :]]


def offer_order(
    jobs: Iterable[PendingJob],
    policy: Policy,
    *,
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    held_gpus: Mapping[str, int],
) -> list[PendingJob]:
    """The jobs in the order the policy offers them to placement (fair order, or arrival order), as if none
    started: for a shell that places some jobs itself (``apps.jobs.scheduler.parts``) but must not jump the queue."""
    queue: ArrivalQueue | FairQueue
    if policy.fair_order:
        queue = FairQueue(jobs, policy, usage=usage, shares=shares, held_gpus=held_gpus)
    else:
        queue = ArrivalQueue(jobs)
    out: list[PendingJob] = []
    while (job := queue.pop()) is not None:
        out.append(job)
    return out
