"""One scheduling pass: ``schedule(snapshot, policy=..., now=...) -> Decisions``.

Why a single pure function: the leader process calls it every second and on events with a snapshot read
in one transaction, and applies the decisions in one transaction; the trace replay calls the very same
function thousands of times in simulated time. Same input, same output: every tie is broken by ids.

The pass, in order:
1. Stops: running jobs past their ``max_duration_s``, reservation-bound jobs whose reservation ended.
2. Jobs bound to a reservation: only on that reservation's GPUs, only inside its window, and only if they
   can end by its end. They have their own GPUs, so they neither block nor are blocked by the queue.
3. Every other job, in the policy's order, through gang best-fit placement. A job that cannot fit now:
   under ``fifo`` it blocks everything behind it; under ``backfill``/``fair`` the first one gets a planned
   start at its earliest possible time (EASY backfill) and later jobs start only on GPUs it does not
   need, or on GPUs they give back before it starts.
   A failed placement is remembered per (gpu count, models): within a pass free capacity only shrinks,
   so a later job of the same shape and an estimate at least as long cannot fit either. That keeps long
   queues cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from apps.jobs.scheduling.longwork import LongWork
from apps.jobs.scheduling.model import (
    INF,
    Decisions,
    PendingJob,
    PlannedStart,
    Reason,
    ReasonCode,
    Snapshot,
    Start,
    Stop,
    StopReason,
)
from apps.jobs.scheduling.placement import EPS, MILLI, ClusterState, ShareState
from apps.jobs.scheduling.policies import FAIR, ArrivalQueue, FairQueue, Policy, arrival_key

ShapeKey = tuple[int, frozenset[str] | None, bool]


def schedule(snapshot: Snapshot, *, policy: Policy = FAIR, now: float, explain: bool = True) -> Decisions:
    """Decide which pending jobs start now and where, which running jobs must stop, and why others wait.

    ``explain=False`` skips the reasons of jobs that wait (the trace replay does not read them).
    """
    state = ClusterState(snapshot, now)
    reasons: dict[str, Reason] = {}
    starts: list[Start] = []
    stops = _stops(snapshot, now)

    bound: list[PendingJob] = []
    general: list[PendingJob] = []
    for job in snapshot.pending:
        if job.gpu_count < 1 or not job.max_duration_s > 0.0:
            reasons[job.id] = Reason(ReasonCode.INVALID, "a job needs at least one GPU and a positive max duration")
        elif not 0 < job.gpu_milli <= MILLI or (job.gpu_milli < MILLI and job.gpu_count != 1):
            reasons[job.id] = Reason(ReasonCode.INVALID, "a fraction of a GPU is above 0 and of one GPU")
        elif job.reservation_id is not None:
            bound.append(job)
        else:
            general.append(job)

    held: dict[str, int] = {}
    for run in snapshot.running:
        held[run.team] = held.get(run.team, 0) + len(run.gpu_ids)
    for job in _schedule_bound(bound, state, starts, reasons, policy=policy, now=now):
        held[job.team] = held.get(job.team, 0) + job.gpu_count

    planned, evaluated = _schedule_general(general, state, starts, reasons, snapshot, held, policy, now, explain)
    return Decisions(
        starts=tuple(starts),
        stops=tuple(stops),
        pending_reasons=reasons,
        planned=planned,
        considered=len(snapshot.pending) - len(general) + evaluated,
    )


def _stops(snapshot: Snapshot, now: float) -> list[Stop]:
    by_id = {r.id: r for r in snapshot.reservations}
    out: list[Stop] = []
    for run in sorted(snapshot.running, key=lambda r: r.id):
        if now >= run.expected_end:
            out.append(Stop(run.id, StopReason.TIMEOUT))
            continue
        resv = by_id.get(run.reservation_id) if run.reservation_id is not None else None
        if resv is not None and now >= resv.end:
            out.append(Stop(run.id, StopReason.RESERVATION_ENDED))
    return out


def _schedule_bound(
    jobs: list[PendingJob],
    state: ClusterState,
    starts: list[Start],
    reasons: dict[str, Reason],
    *,
    policy: Policy,
    now: float,
) -> list[PendingJob]:
    """Place reservation-bound jobs on their reservation's free GPUs; returns the ones started."""
    if policy.fair_order:
        jobs = sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.id))
    else:
        jobs = sorted(jobs, key=arrival_key)
    started: list[PendingJob] = []
    for job in jobs:
        rid = job.reservation_id
        assert rid is not None
        resv = state.reservations.get(rid)
        end = now + job.max_duration_s
        if resv is None:
            reasons[job.id] = Reason(ReasonCode.RESERVATION_UNKNOWN, f"reservation {rid} is not booked or has ended")
        elif resv.team != job.team:
            reasons[job.id] = Reason(ReasonCode.RESERVATION_OTHER_TEAM, f"reservation {rid} belongs to another team")
        elif now < resv.start:
            reasons[job.id] = Reason(
                ReasonCode.RESERVATION_NOT_STARTED, f"reservation {rid} starts in {span(resv.start - now)}"
            )
        elif end > resv.end + EPS:
            reasons[job.id] = Reason(
                ReasonCode.OUTSIDE_RESERVATION_WINDOW,
                f"max duration {span(job.max_duration_s)} does not fit: reservation {rid} ends in "
                f"{span(resv.end - now)}",
            )
        elif job.gpu_count > state.reservation_capacity(rid, job.models):
            reasons[job.id] = Reason(
                ReasonCode.GANG_DOES_NOT_FIT,
                f"reservation {rid} has no node with {job.gpu_count} GPUs of {_models_text(job.models)}",
            )
        else:
            spot = state.find_in_reservation(rid, job.gpu_count, job.models)
            if spot is None:
                reasons[job.id] = Reason(
                    ReasonCode.WAITING_FOR_RESERVED_GPUS,
                    f"waiting for {job.gpu_count} free GPU(s) of reservation {rid} on one node",
                )
                continue
            n, gpus = spot
            state.take_reserved(rid, gpus, end)
            starts.append(Start(job.id, state.node_names[n], tuple(state.gpu_ids[i] for i in gpus), end))
            started.append(job)
    return started


def _schedule_general(
    jobs: list[PendingJob],
    state: ClusterState,
    starts: list[Start],
    reasons: dict[str, Reason],
    snapshot: Snapshot,
    held: Mapping[str, int],
    policy: Policy,
    now: float,
    explain: bool,
) -> tuple[PlannedStart | None, int]:
    """Offer the queue to placement; returns the planned (shadow) start and how many jobs were evaluated."""
    queue: ArrivalQueue | FairQueue
    if policy.fair_order:
        queue = FairQueue(jobs, policy, usage=snapshot.team_usage, shares=snapshot.team_shares, held_gpus=held)
    else:
        queue = ArrivalQueue(jobs)
    node_names = state.node_names
    gpu_ids = state.gpu_ids
    shares = ShareState(snapshot, state)
    longwork = LongWork(
        snapshot,
        state,
        long_job_s=policy.long_job_s,
        nodes_kept=policy.gang_nodes_kept,
        patience_s=policy.long_job_patience_s,
    )
    failed: dict[ShapeKey, float] = {}
    head: PendingJob | None = None
    planned: PlannedStart | None = None
    evaluated = 0
    while (job := queue.pop()) is not None:
        evaluated += 1
        count = job.gpu_count
        models = job.models
        duration = job.max_duration_s
        if count > state.largest_gang(models):
            reasons[job.id] = _infeasible(state, job)
            continue
        milli = job.gpu_milli
        # Long work that leaves part of a node: first where long work already is, elsewhere only while enough
        # nodes stay clear of it for gangs (longwork.py).
        contained = longwork.applies_to(job)
        # A fraction's shape is its size (negative, apart from gang sizes): a smaller one may fit where it failed.
        # A job held to long work's nodes has fewer choices, so its failure says nothing about a free one.
        shape = (count if milli >= MILLI else -milli, models, contained)
        shortest_failed = failed.get(shape, INF)
        spot: tuple[int, list[int]] | None = None
        tries = ((longwork.homes(), None) if longwork.may_open() else (longwork.homes(),)) if contained else (None,)
        for nodes in tries if duration < shortest_failed else ():
            if milli < MILLI:
                placed = shares.place_fraction(milli, models, duration, nodes)
                spot = (placed[0], [placed[1]]) if placed is not None else None
            else:
                spot = state.find(count, models, duration, nodes)
                if spot is not None:
                    state.take(spot[0], spot[1], now + duration)
            if spot is not None:
                break
        if spot is not None:
            n, gpus = spot
            if contained:
                longwork.took(n)
            end = now + duration
            starts.append(
                Start(job.id, node_names[n], tuple(gpu_ids[i] for i in gpus), end, planned is not None, milli)
            )
            queue.started(job)
            continue
        if duration < shortest_failed:
            failed[shape] = duration
        if head is not None:
            if explain:
                reasons[job.id] = _why_waiting(state, job, planned)
            continue
        head = job
        if not policy.backfill:
            reasons[job.id] = _why_waiting(state, job, None)
            if explain:
                _blocked_behind(queue.rest(), head, state, reasons)
            break
        estimate = state.earliest_start(count, models, duration, longwork.homes() if contained else None)
        if estimate is None:
            reasons[job.id] = Reason(
                ReasonCode.WAITING_FOR_GPUS,
                f"waiting for {count} GPU(s) of {_models_text(models)} on one node; no start time can be "
                "estimated (a GPU it needs is held without an expected end)",
            )
            continue
        t, n, gpus = estimate
        state.hold_for(gpus, t)
        planned = PlannedStart(job.id, node_names[n], tuple(gpu_ids[i] for i in gpus), t)
        reasons[job.id] = Reason(
            ReasonCode.NEXT_IN_LINE,
            f"next in line: {count} GPU(s) on {node_names[n]} are planned for it in {span(t - now)} at the latest",
        )
    return planned, evaluated


def _blocked_behind(
    rest: Iterable[PendingJob], head: PendingJob, state: ClusterState, reasons: dict[str, Reason]
) -> None:
    behind = Reason(ReasonCode.BEHIND_HEAD, f"waiting behind job {head.id} (strict arrival order)")
    for job in rest:
        if job.gpu_count > state.largest_gang(job.models):
            reasons[job.id] = _infeasible(state, job)
        else:
            reasons[job.id] = behind


def _infeasible(state: ClusterState, job: PendingJob) -> Reason:
    if not state.models_for(job.models):
        return Reason(ReasonCode.GANG_DOES_NOT_FIT, f"no GPU of {_models_text(job.models)} in the fleet")
    return Reason(
        ReasonCode.GANG_DOES_NOT_FIT,
        f"gang does not fit on any node: no node has {job.gpu_count} GPUs of {_models_text(job.models)}",
    )


def _why_waiting(state: ClusterState, job: PendingJob, planned: PlannedStart | None) -> Reason:
    count, models, duration = job.gpu_count, job.models, job.max_duration_s
    if planned is not None and state.fits_relaxed(count, models, duration, portal=False):
        return Reason(
            ReasonCode.WOULD_DELAY_NEXT,
            f"the free GPUs are planned for job {planned.job_id} in {span(planned.start - state.now)}; "
            "this job would delay it",
        )
    if state.fits_relaxed(count, models, duration, portal=True):
        return Reason(
            ReasonCode.HELD_BY_RESERVATION,
            f"{count} GPU(s) of {_models_text(models)} are free but held by a reservation",
        )
    return Reason(ReasonCode.WAITING_FOR_GPUS, f"waiting for {count} free GPU(s) of {_models_text(models)} on one node")


def _models_text(models: frozenset[str] | None) -> str:
    if models is None:
        return "any model"
    return "model " + "|".join(sorted(models))


def span(seconds: float) -> str:
    """A short human duration ('45 s', '12 min', '3.5 h', '2.0 d')."""
    if seconds == INF:
        return "never"
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
