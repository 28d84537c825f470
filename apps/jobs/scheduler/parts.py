"""The scheduler's starts of jobs on parts of GPUs (a MIG instance of a profile, a share of a shared GPU).

They run after the pass over whole GPUs, in the policy's order (fair share and size, as the core offers its own
queue: `scheduling.offer_order`), each in its own transaction under the fence: the part
is chosen by booking's placement (`apps.booking.services.devices`, best fit under the model's placement lock, the
same as a booking of a part) and held by the job's allocation, so bookings and jobs of parts never oversubscribe
a GPU. A job bound to a reservation of parts runs on one of the reservation's parts that none of its jobs uses.
Shared GPUs and GPUs in MIG mode are not in the whole-GPU snapshot, so the two passes never meet on a GPU.

A job that does not fit gets a planned start (`part_plans.py`): jobs after it in the order may take the parts
planned for it only if they end by then, and the job's pending reason says when.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from math import inf as INF

from django.db import transaction

from apps.booking.models import Reservation, ReservationStatus
from apps.booking.selectors import reservation_parts
from apps.booking.services.devices import check_part_in_fleet, place_parts_locked, profiles_with_memory
from apps.booking.services.gpus import GpuInfo
from apps.core.errors import ApplicationError
from apps.fleet.models import Gpu, GpuModel, PoolBackend
from apps.jobs import conf, occupancy
from apps.jobs.models import ON_NODE_STATES, Job
from apps.jobs.scheduler.part_plans import PartPlanner, asked, say
from apps.jobs.scheduling import PendingJob, Policy, ReasonCode, Snapshot, offer_order, span
from apps.jobs.services import starting
from apps.jobs.services.transitions import TransitionRefused


class _Unsuitable(Exception):
    """The part booking's placement chose cannot run this job: roll its allocation back."""


def _runs_here(job: Job, gpus: list[Gpu]) -> bool:
    """One node, a model the job accepts, and a pool the portal's agents run (a Slurm pool's GPUs are Slurm's)."""
    node = gpus[0].node if gpus else None
    if node is None or len({g.node_id for g in gpus}) != 1:
        return False
    if job.gpu_models and gpus[0].model.name not in job.gpu_models:
        return False
    return node.pool is None or node.pool.backend == PoolBackend.AGENTS


def is_part_job(job: Job) -> bool:
    """Does the job ask for a MIG instance (by profile or by memory) or a share of a GPU?"""
    return job.on_part()


def in_policy_order(jobs: list[Job], snapshot: Snapshot, policy: Policy) -> list[Job]:
    """`jobs` in the order the policy offers them: by priority, fair share and size under `fair`, as the core
    orders the whole-GPU queue (team usage and GPUs held from the pass's snapshot)."""
    held: dict[str, int] = {}
    for run in snapshot.running:
        held[run.team] = held.get(run.team, 0) + len(run.gpu_ids)
    by_id = {str(j.pk): j for j in jobs}
    core = [
        PendingJob(
            id=key,
            team=str(j.team_id),
            user=str(j.user_id),
            gpu_count=j.gpu_count,
            max_duration_s=float(j.max_duration_s),
            submitted_at=j.submitted_at.timestamp(),
            priority=j.priority,
            gpu_milli=round(float(j.gpu_share) * 1000) if j.gpu_share is not None else 1000,
        )
        for key, j in by_id.items()
    ]
    ordered = offer_order(core, policy, usage=snapshot.team_usage, shares=snapshot.team_shares, held_gpus=held)
    return [by_id[p.id] for p in ordered]


def start_part_jobs(jobs: list[Job], *, now: datetime, claim: Callable[[], None]) -> list[int]:
    """Start what fits of `jobs` (queued jobs on parts, in the order given); plan the others' starts (module
    docstring); returns the ids started. `claim`: called in each transaction first (the leader's fence), so a
    deposed leader starts nothing."""
    started: list[int] = []
    planner = PartPlanner(now=now)
    failed: dict[tuple[object, ...], float] = {}  # shape -> shortest duration that did not fit: longer ones skip
    layout: dict[tuple[object, ...], str | None] = {}  # shape -> why the layout cannot give it (None: it can)
    for job in jobs:
        if job.reservation_id is not None:
            if _start_in_reservation(job, now=now, claim=claim):
                started.append(job.pk)
            continue
        duration = timedelta(seconds=job.max_duration_s + conf.ALLOCATION_SLACK_S)
        end = now + duration
        model = GpuModel.objects.filter(name=job.gpu_models[0]).first() if len(job.gpu_models) == 1 else None
        shape = (job.mig_profile, job.mig_memory_mib, job.gpu_share, tuple(job.gpu_models), job.gpu_count)
        if duration.total_seconds() >= failed.get(shape, INF):
            _wait(job, model, shape, planner, layout, duration=duration, detail=None)
            continue
        # Parts planned for jobs ahead of this one that it would still hold when they are due.
        kept = planner.kept_until(end)
        try:
            with transaction.atomic():
                claim()
                chosen = place_parts_locked(
                    team=job.team,
                    user=job.user,
                    model=model,
                    uuids=[],
                    mig_profile=job.mig_profile or None,
                    mig_memory_mib=job.mig_memory_mib if not job.mig_profile else None,
                    gpu_share=job.gpu_share,
                    count=1 if job.gpu_share is not None else job.gpu_count,
                    start=now,
                    end=end,
                    exclude=kept,
                    explain=False,
                )
                if not job.mig_profile and chosen[0].profile:
                    # Asked by memory: from now on it is a job on an instance of the profile it got.
                    job.mig_profile = chosen[0].profile
                    Job.objects.filter(pk=job.pk).update(mig_profile=job.mig_profile)
                gpus = list(
                    Gpu.devices.select_related("model", "node__pool", "parent").filter(pk__in=[g.id for g in chosen])
                )
                if not _runs_here(job, gpus):
                    raise _Unsuitable  # leaving the block by an exception undoes the part's allocation
                starting.job_start(job=job, node=gpus[0].node, gpus=gpus, now=now, savepoint=False)
                _note_outside_use(job, chosen)
        except ApplicationError as exc:
            # Nothing fitting free now (409), or no longer possible at all (400: the fleet changed): it stays queued.
            failed[shape] = min(failed.get(shape, INF), duration.total_seconds())
            _wait(job, model, shape, planner, layout, duration=duration, detail=exc.detail)
            continue
        except (TransitionRefused, _Unsuitable):
            continue  # the job moved meanwhile, or the part is not one this job can run on: it stays queued
        started.append(job.pk)
        if job.mig_memory_mib is not None:
            # Held as the smallest profile with that memory, it counts the one it got. In a transaction of its own,
            # after the start's: the quota rows are locked before GPUs everywhere else, never after.
            occupancy.quota_fit_to_profile(job=job)
    return started


def _note_outside_use(job: Job, chosen: list[GpuInfo]) -> None:
    """The parts the job got that something outside the portal uses (nothing free of such use fitted): its start
    event says so, as a whole GPU's does (apply._note_outside_use)."""
    used = [(c, c.in_use_outside_mib) for c in chosen if c.in_use_outside_mib]
    if used:
        where = ", ".join(f"{c.node}/{c.parent_index} {c.profile or 'share'} ({mib / 1024:.1f} GiB)" for c, mib in used)
        starting.note_outside_use(job_id=job.pk, where=where, what="part")


def _wait(
    job: Job,
    model: GpuModel | None,
    shape: tuple[object, ...],
    planner: PartPlanner,
    layout: dict[tuple[object, ...], str | None],
    *,
    duration: timedelta,
    detail: str | None,
) -> None:
    """A job that did not start: told that the GPUs are no longer laid out to give its part, or planned (or told
    why it waits). Submission refuses such a part, but admins change layouts under queued jobs (a GPU split
    differently, repartitioned, taken out of MIG mode): such a job can only wait for a layout, not for GPUs."""
    if shape not in layout:
        layout[shape] = _not_in_layout(job, model)
    why = layout[shape]
    if why is not None:
        say(
            job,
            ReasonCode.PART_NOT_IN_LAYOUT,
            f"cannot start on the GPUs as they are laid out now: {why} It starts once an admin lays a GPU out to "
            "give it; cancel it to ask for another part.",
        )
        return
    planner.plan_or_wait(job, model, shape, duration=duration, detail=detail)


def _not_in_layout(job: Job, model: GpuModel | None) -> str | None:
    """Why the GPUs the job may run on (its models, or any; `model`: its one model) are not laid out to give its
    part; None if they are. One small query, once per shape and pass, and only for jobs that did not start."""
    try:
        if job.mig_memory_mib is not None and not job.mig_profile:
            profiles_with_memory(job.mig_memory_mib, model_id=model.pk if model is not None else None)
        else:
            check_part_in_fleet(
                mig_profile=job.mig_profile or None, gpu_share=job.gpu_share, models=list(job.gpu_models)
            )
    except ApplicationError as exc:
        return str(exc.detail)
    return None


def _start_in_reservation(job: Job, *, now: datetime, claim: Callable[[], None]) -> bool:
    """Start a job bound to a reservation of parts on parts of it that no job of it uses (one instance, or as many
    shares of one GPU as its share makes), inside the window and only if it can end by the reservation's end (the
    core stops it there, as a whole-GPU job in a reservation). The reservation's allocation holds the parts, so the
    job takes none of its own."""
    rid = job.reservation_id
    assert rid is not None
    resv = Reservation.objects.filter(pk=rid).first()
    if resv is None or resv.status not in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE):
        say(job, ReasonCode.RESERVATION_UNKNOWN, f"reservation {rid} is not booked or has ended")
        return False
    if now < resv.start:
        when = span((resv.start - now).total_seconds())
        say(job, ReasonCode.RESERVATION_NOT_STARTED, f"reservation {rid} starts in {when}")
        return False
    if now + timedelta(seconds=job.max_duration_s) > resv.end:
        left = span((resv.end - now).total_seconds())
        say(
            job,
            ReasonCode.OUTSIDE_RESERVATION_WINDOW,
            f"max duration {span(job.max_duration_s)} does not fit: reservation {rid} ends in {left}",
        )
        return False
    wanted = Decimal(job.gpu_share) if job.gpu_share is not None else None
    matching = [p for p in reservation_parts(reservation_id=resv.pk) if p.matches(job.mig_profile, wanted)]
    need = {p.parent_id: (p.shares_for(wanted) or 1) if wanted is not None else 1 for p in matching}
    ids = [p.gpu_id for p in matching]
    try:
        with transaction.atomic():
            claim()
            busy = set(
                Job.gpus.through.objects.filter(gpu_id__in=ids, job__state__in=ON_NODE_STATES).values_list(
                    "gpu_id", flat=True
                )
            )
            free = list(
                Gpu.devices.select_related("model", "node__pool", "parent")
                .filter(pk__in=[i for i in ids if i not in busy])
                .order_by("id")
            )
            by_gpu: dict[int, list[Gpu]] = {}
            for g in free:
                if g.parent_id is not None and _runs_here(job, [g]):
                    by_gpu.setdefault(g.parent_id, []).append(g)
            fitting = [(len(gs) - need[gpu], gpu) for gpu, gs in by_gpu.items() if len(gs) >= need[gpu]]
            if not fitting:
                users = sorted(
                    Job.objects.filter(reservation_id=rid, state__in=ON_NODE_STATES).values_list("pk", flat=True)
                )
                held = f" (in use by job {', '.join(map(str, users))})" if users else ""
                say(
                    job,
                    ReasonCode.WAITING_FOR_RESERVED_GPUS,
                    f"waiting for {asked(job)} of reservation {rid}{held}",
                )
                return False
            gpu = min(fitting)[1]  # the GPU left with the fewest free reserved parts: best fit
            chosen = sorted(by_gpu[gpu], key=lambda g: g.index)[: need[gpu]]
            starting.job_start(job=job, node=chosen[0].node, gpus=chosen, now=now, savepoint=False)
    except (ApplicationError, TransitionRefused):
        return False
    return True
