"""A scheduler pass's writes: the decisions applied in ONE transaction, fenced against a newer leader.

Plain starts go in one batch; a job in a reservation or of a team with a concurrent-GPU cap, or every start of a
batch that was refused, goes in a savepoint of its own, with booking's allocation constraint as the last guard (a
start that loses the race stays queued). Launch and stop commands leave after commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.fleet.models import Gpu, Node
from apps.jobs import conf, occupancy
from apps.jobs.models import ON_NODE_STATES, Job, JobReason, JobState, SchedulerState
from apps.jobs.scheduler.leadership import NotLeader
from apps.jobs.scheduler.parts import in_policy_order, start_part_jobs
from apps.jobs.scheduler.snapshot import PassContext, UsageCache, epoch, load_snapshot
from apps.jobs.scheduling import Decisions, Policy, ReasonCode, StopReason, schedule
from apps.jobs.services import starting, transitions


@dataclass
class PassResult:
    started: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    pending: int = 0
    ms: float = 0.0


def claim_fence(token: int, leader: str) -> None:
    """Move the fence to our token; a newer leader's token there means we are not the leader any more."""
    state = SchedulerState.objects.filter(pk=1, fence__lte=token)
    updated = state.update(fence=token, leader=leader[:200])
    if not updated:
        # The row is made once (a new installation), not looked up on every pass.
        _, created = SchedulerState.objects.get_or_create(pk=1)
        if created:
            updated = state.update(fence=token, leader=leader[:200])
    if not updated:
        raise NotLeader(f"a leader with a token above {token} has taken over")


def _layout_unchanged(ctx: PassContext, decisions: Decisions) -> bool:
    """Whether no GPU was split differently since the snapshot. Read after `claim_fence`, which holds the row a
    change bumps until this transaction ends, so a change either committed before (and this sees it: the pass
    starts nothing, the next one places on the new layout) or waits for this pass's allocations (and is refused)."""
    if not decisions.starts:
        return True
    now_version = SchedulerState.objects.filter(pk=1).values_list("layout_version", flat=True).first() or 0
    return bool(now_version == ctx.layout_version)


def apply_decisions(ctx: PassContext, decisions: Decisions, *, token: int, leader: str) -> PassResult:
    """Apply one pass's decisions in one transaction (plain starts in one batch, the others each in a savepoint)."""
    result = PassResult(pending=len(ctx.pending))
    now = ctx.now
    grace = _reservation_grace_s()
    with transaction.atomic():
        claim_fence(token, leader)
        items: list[starting.StartItem] = []
        gpu_by_id, node_by_id = _instances_for(ctx, decisions)
        for start in decisions.starts if _layout_unchanged(ctx, decisions) else ():
            job = ctx.pending.get(start.job_id)
            node = node_by_id.get(ctx.nodes.get(start.node, 0))
            # A split GPU is held whole through all its shares (as a whole-GPU booking of it is).
            ids = [i for g in start.gpu_ids for i in ctx.split_shares.get(g, [int(g)])]
            chosen = [gpu_by_id.get(i) for i in ids]
            if job is None or node is None or any(g is None for g in chosen):
                continue  # a GPU or node deleted since the snapshot: the next pass sees the fleet as it is
            items.append(starting.StartItem(job=job, node=node, gpus=[g for g in chosen if g is not None]))
        # Most starts need nothing but their allocations: those go in one batch. Jobs in a reservation (no
        # allocation) or of a team with a concurrent-GPU cap (a quota check each) go one by one, and so does
        # the whole batch when any of it is refused (a GPU taken meanwhile, a job cancelled), to learn which.
        batch: list[starting.StartItem] = []
        one_by_one: list[starting.StartItem] = []
        for item in items:
            plain = item.job.reservation_id is None and not occupancy.team_limits_concurrency(item.job.team_id)
            (batch if plain else one_by_one).append(item)
        if len(batch) > 1:
            try:
                # This savepoint is the one a failed batch rolls back to; the service adds none of its own.
                with transaction.atomic():
                    result.started.extend(starting.jobs_start_many(items=batch, now=now, savepoint=False))
            except ApplicationError:
                one_by_one = items
        else:
            one_by_one = items
        for item in one_by_one:
            job, node, gpus = item.job, item.node, item.gpus
            try:
                with transaction.atomic():
                    starting.job_start(job=job, node=node, gpus=gpus, now=now, savepoint=False)
                result.started.append(job.pk)
            except ApplicationError as exc:
                # Lost a race for a GPU (the allocation constraint), the team's concurrent-GPU quota, or the
                # job was cancelled meanwhile: it stays where it is and the next pass looks again.
                result.refused[job.pk] = exc.code
                Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                    pending_reason=exc.code[:40], pending_message=exc.detail[:300]
                )
        for stop in decisions.stops:
            row = ctx.running.get(stop.job_id)
            if row is None:
                continue
            if row.stop_requested_at and (now - row.stop_requested_at).total_seconds() < conf.STOP_RESEND_S:
                continue
            if stop.reason == StopReason.TIMEOUT:
                # The node kills the job at its deadline itself; this is the backstop for a node that did not.
                began = row.started_at or row.scheduled_at or now
                overdue = (now - began).total_seconds() - row.max_duration_s
                if overdue < conf.CANCEL_GRACE_S + 20:
                    continue
                reason = JobReason.TIMEOUT
            else:
                end = ctx.reservation_ends.get(str(row.reservation_id))
                if end is not None and (now - end).total_seconds() < grace:
                    continue
                reason = JobReason.PREEMPTED
            job = Job.objects.select_related("node").filter(pk=row.id, state__in=ON_NODE_STATES).first()
            if job is None:
                continue  # it ended since the snapshot
            transitions.job_request_stop(job=job, reason=reason, grace_s=conf.CANCEL_GRACE_S)
            result.stopped.append(job.pk)
        _note_outside_use(ctx, items, set(result.started))
        _store_reasons(ctx, decisions, result)
    return result


def _note_outside_use(ctx: PassContext, items: list[starting.StartItem], started: set[int]) -> None:
    """A job started on a GPU something outside the portal uses (no GPU free of it fitted) says so on its start
    event (starting.note_outside_use)."""
    if not ctx.outside:
        return
    for item in items:
        used = [(g, ctx.outside[str(g.pk)]) for g in item.gpus if str(g.pk) in ctx.outside]
        if not used or item.job.pk not in started:
            continue
        where = ", ".join(f"{item.node.name}/{g.index} ({mib / 1024:.1f} GiB)" for g, mib in used)
        starting.note_outside_use(job_id=item.job.pk, where=where)


def _instances_for(ctx: PassContext, decisions: Decisions) -> tuple[dict[int, Gpu], dict[int, Node]]:
    """The GPUs or shares (with their model: prices) and nodes (token digest: signing) this pass starts jobs on."""
    gpu_ids = sorted(
        {i for start in decisions.starts for g in start.gpu_ids for i in ctx.split_shares.get(g, [int(g)])}
    )
    if not gpu_ids:
        return {}, {}
    node_ids = sorted({ctx.nodes[start.node] for start in decisions.starts if start.node in ctx.nodes})
    # Gpu.devices: a split GPU's shares are parts, which `Gpu.objects` leaves out.
    gpus = Gpu.devices.select_related("model", "parent").in_bulk(gpu_ids)
    return gpus, Node.objects.in_bulk(node_ids)


def _store_reasons(ctx: PassContext, decisions: Decisions, result: PassResult) -> None:
    """Write why each job waits, only where it changed (most passes change nothing)."""
    by_reason: dict[tuple[str, str], list[int]] = {}
    for job_id, reason in decisions.pending_reasons.items():
        job = ctx.pending.get(job_id)
        if job is None or job.pk in result.refused:
            continue
        code = str(reason.code.value if isinstance(reason.code, ReasonCode) else reason.code)[:40]
        message = reason.message[:300]
        if job.pending_reason != code or job.pending_message != message:
            by_reason.setdefault((code, message), []).append(job.pk)
    for (code, message), ids in by_reason.items():
        Job.objects.filter(pk__in=ids, state=JobState.QUEUED).update(pending_reason=code, pending_message=message)


def _reservation_grace_s() -> float:
    try:
        from apps.booking.selectors import booking_policy

        return float(booking_policy().end_grace_minutes * 60)
    except Exception:
        return float(conf.RESERVATION_GRACE_S)


def run_pass(
    *, token: int, leader: str, policy: Policy, usage: UsageCache | None = None, now: datetime | None = None
) -> PassResult:
    """Snapshot, decide, apply. Raises NotLeader when a newer leader exists."""
    t0 = time.perf_counter()
    now = now or timezone.now()
    ctx = load_snapshot(now, usage)
    decisions = schedule(ctx.snapshot, policy=policy, now=epoch(now))
    result = apply_decisions(ctx, decisions, token=token, leader=leader)
    if ctx.part_jobs:
        ordered = in_policy_order(ctx.part_jobs, ctx.snapshot, policy)
        result.started += start_part_jobs(ordered, now=now, claim=lambda: claim_fence(token, leader))
    result.ms = (time.perf_counter() - t0) * 1000
    pending = max(0, result.pending - len(result.started))
    SchedulerState.objects.filter(pk=1, fence=token).update(
        last_pass_at=now,
        last_pass_ms=result.ms,
        last_started=len(result.started),
        pending=pending,
        passes=F("passes") + 1,
    )
    return result
