"""Writes for jobs: submit, cancel, the one state transition function, and what nodes report.

Every state change goes through `job_transition`, a conditional UPDATE on the current state: two racing
transitions (a cancel and an exit report, two copies of one report) cannot both win, and an illegal move
(`succeeded → running`) is refused. Broadcasts and scheduler wake-ups happen after commit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import team_ids_of
from apps.booking import quota as quota_math
from apps.booking import selectors as booking_selectors
from apps.booking.selectors import local_tz
from apps.core import rawsql
from apps.core.errors import ApplicationError, Conflict, Forbidden, NotFound, ValidationFailed
from apps.fleet.models import Gpu, GpuModel, Node
from apps.jobs import conf, events, occupancy, selectors, validation
from apps.jobs.models import (
    ON_NODE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    ContainerImage,
    Job,
    JobEvent,
    JobLogLine,
    JobReason,
    JobState,
    LogStream,
    TeamJobPolicy,
)

logger = logging.getLogger(__name__)


class TransitionRefused(Conflict):
    """The job is not in a state from which this move is legal (or another transition got there first)."""

    code = "illegal_transition"


# --- Submission -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamLimits:
    max_priority: int
    max_duration_s: int
    max_gpus_per_job: int | None
    max_queued_jobs: int


def limits_of(policy: TeamJobPolicy | None) -> TeamLimits:
    return TeamLimits(
        max_priority=policy.max_priority if policy else conf.DEFAULT_MAX_PRIORITY,
        max_duration_s=min(policy.max_duration_s or conf.MAX_DURATION_S, conf.MAX_DURATION_S)
        if policy
        else conf.MAX_DURATION_S,
        max_gpus_per_job=policy.max_gpus_per_job if policy else None,
        max_queued_jobs=(
            policy.max_queued_jobs if policy and policy.max_queued_jobs else conf.DEFAULT_MAX_QUEUED_PER_TEAM
        ),
    )


def _field_error(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={field: [message]})


def _check_int(field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field_error(field, f"{field} must be an integer.")
    if not lo <= value <= hi:
        raise _field_error(field, f"{field} must be between {lo} and {hi}.")
    return value


def _check_cpus(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal) or not math.isfinite(float(value)):
        raise _field_error("cpus", "cpus must be a number.")
    if not 0 < float(value) <= conf.MAX_CPUS:
        raise _field_error("cpus", f"cpus must be more than 0 and at most {conf.MAX_CPUS}.")
    return Decimal(str(value)).quantize(Decimal("0.01"))


def _check_image(name: Any, image: ContainerImage | None) -> ContainerImage:
    """`image`: the enabled allow-list entry named `name`, as the caller looked it up (None: there is none)."""
    if not isinstance(name, str) or not name:
        raise _field_error("image", "image is required.")
    if image is None:
        allowed = list(ContainerImage.objects.filter(enabled=True).values_list("name", flat=True)[:20])
        raise ValidationFailed(
            f"Image {name!r} is not on the portal's allow-list.",
            code="image_not_allowed",
            fields={"image": [f"not allowed; allowed images: {', '.join(allowed) or 'none'}"]},
        )
    return image


_FLEET_SHAPE_TTL_S = 10.0
_fleet_shape_cache: dict[tuple[str, ...], tuple[float, int]] = {}


def _check_fleet_shape(gpu_count: int, models: list[str]) -> None:
    """Refuse what can never run: an unknown model, or more GPUs of the models than any one node has.

    The largest node's size is remembered for _FLEET_SHAPE_TTL_S and only used to accept (the query counts every
    GPU of the fleet, on every submission): a refusal is always decided on fresh numbers. A node retired in those
    seconds can let a job in that waits with the scheduler's "no node has N GPUs" reason instead of a 400."""
    key = tuple(sorted(models))
    hit = _fleet_shape_cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < _FLEET_SHAPE_TTL_S and 0 < gpu_count <= hit[1]:
        return
    if models:
        known = set(GpuModel.objects.filter(name__in=models).values_list("name", flat=True))
        unknown = [m for m in models if m not in known]
        if unknown:
            raise _field_error("gpu_model", f"Unknown GPU model {unknown[0]!r}.")
    gpus = Gpu.objects.filter(retired_at__isnull=True)
    if models:
        gpus = gpus.filter(model__name__in=models)
    largest = gpus.values("node_id").annotate(n=Count("id")).order_by("-n").values_list("n", flat=True).first() or 0
    _fleet_shape_cache[key] = (time.monotonic(), largest)
    what = f"GPUs of model {'|'.join(models)}" if models else "GPUs"
    if largest == 0:
        raise _field_error("gpu_model" if models else "gpu_count", f"No {what} in the fleet.")
    if gpu_count > largest:
        raise _field_error(
            "gpu_count", f"No node has {gpu_count} {what} (the largest has {largest}); a job runs on one node."
        )


# A queue this close to the team's limit is counted again inside the submission's transaction.
_QUEUED_RECOUNT_MARGIN = 16


def _refuse_if_queue_full(team: Team, queued: int, limit: int) -> None:
    if queued >= limit:
        raise ApplicationError(
            f"Team {team.slug} already has {queued} queued jobs (at most {limit}).", code="too_many_queued", status=429
        )


def _check_reservation(reservation_id: Any, *, user: Any, team: Team, gpu_count: int, max_duration_s: int) -> Any:
    from apps.booking.models import Reservation, ReservationStatus

    if isinstance(reservation_id, bool) or not isinstance(reservation_id, int):
        raise _field_error("reservation", "reservation must be a reservation id.")
    reservation = Reservation.objects.visible_to(user).filter(pk=reservation_id).first()
    if reservation is None:
        raise NotFound("No such reservation.", fields={"reservation": ["no such reservation"]})
    if reservation.team_id != team.pk:
        raise Forbidden(
            "That reservation belongs to another team.", fields={"reservation": ["belongs to another team"]}
        )
    now = timezone.now()
    if reservation.status not in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE) or reservation.end <= now:
        raise _field_error("reservation", "That reservation has ended or was cancelled.")
    if gpu_count > reservation.gpu_count:
        raise _field_error("gpu_count", f"The reservation holds {reservation.gpu_count} GPU(s).")
    window = (reservation.end - max(reservation.start, now)).total_seconds()
    if max_duration_s > window:
        raise _field_error(
            "max_duration_s", f"max_duration_s must fit the reservation (at most {int(window)} s from its start)."
        )
    return reservation


def job_submit(
    *,
    user: Any,
    team: Team,
    image: str,
    command: Any,
    gpu_count: int = 1,
    gpu_model: Any = None,
    gpu_models: Any = None,
    env: Any = None,
    mounts: Any = None,
    name: str = "",
    cpus: Any = None,
    memory_mib: Any = None,
    max_duration_s: Any = None,
    priority: Any = 0,
    reservation_id: Any = None,
    network: str | None = None,
    options: Mapping[str, Any] | None = None,
    idempotency_key: str = "",
    check_fleet: bool = True,
) -> Job:
    """Validate, authorize and queue a job; counts its max duration against the team's quota.

    Refusals are ApplicationErrors (400 invalid, 403 forbidden/policy_violation/quota_exceeded, 404) and leave
    nothing behind. With `idempotency_key`, a second submission with the same key returns the first job.
    `check_fleet=False` skips "could this ever fit the fleet" (demo data loaded before any agent registered).
    Locks: the team's quota usage row (booking's quota service), for the whole transaction.
    """
    # `is_member`: when the caller looked the team up with booking's team_for_booking (saves a query).
    member = getattr(team, "is_member", None)
    if member is None:
        member = team.pk in team_ids_of(user)
    if not user.is_staff and not member:
        raise Forbidden(f"You are not a member of team {team.slug}.")
    if idempotency_key:
        existing = Job.objects.filter(user=user, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing

    validation.check_options(options or {})
    network = validation.check_network(network)
    argv = validation.check_command(command)
    clean_env = validation.check_env(env)
    facts = selectors.submission_facts(team_id=team.pk, image=image if isinstance(image, str) else "")
    limits = limits_of(facts.policy)
    _refuse_if_queue_full(team, facts.queued, limits.max_queued_jobs)
    max_gpus = limits.max_gpus_per_job or 64
    gpu_count = _check_int("gpu_count", gpu_count, 1, max_gpus)
    models = validation.check_gpu_models(gpu_model, gpu_models)
    cpus_value = _check_cpus(conf.DEFAULT_CPUS if cpus is None else cpus)
    memory = _check_int(
        "memory_mib", conf.DEFAULT_MEMORY_MIB if memory_mib is None else memory_mib, 16, conf.MAX_MEMORY_MIB
    )
    duration = _check_int(
        "max_duration_s",
        conf.DEFAULT_MAX_DURATION_S if max_duration_s is None else max_duration_s,
        1,
        limits.max_duration_s,
    )
    top = conf.STAFF_MAX_PRIORITY if user.is_staff else limits.max_priority
    priority = _check_int("priority", 0 if priority is None else priority, conf.MIN_PRIORITY, top)
    if not isinstance(name, str) or len(name) > conf.MAX_NAME_CHARS:
        raise _field_error("name", f"name must be at most {conf.MAX_NAME_CHARS} characters.")
    container_image = _check_image(image, facts.image)
    clean_mounts = validation.check_mounts(mounts, container_image.allowed_mounts)
    quotas = None
    if reservation_id is None:
        # The team's quotas for the months the job may run in: read once, for the models and for the hold.
        begin = timezone.now()
        months = [m for m, _ in quota_math.split_by_month(begin, begin + timedelta(seconds=duration), local_tz())]
        quotas = booking_selectors.quotas_for(team_id=team.pk, months=months)
    if not models and reservation_id is None:
        # "Any model" means any model the team may use: narrowed here, the scheduler never places the job on a
        # model the quota excludes (an explicit model it excludes is refused by the quota hold below, 403).
        # A job bound to a reservation runs on the reservation's GPUs, which the quota allowed when booked.
        models = booking_selectors.allowed_model_names(team_id=team.pk, quotas=quotas)
    if check_fleet:
        _check_fleet_shape(gpu_count, models)
    reservation = None
    if reservation_id is not None:
        reservation = _check_reservation(
            reservation_id, user=user, team=team, gpu_count=gpu_count, max_duration_s=duration
        )

    try:
        with transaction.atomic():
            if facts.queued >= limits.max_queued_jobs - _QUEUED_RECOUNT_MARGIN:
                # Near the limit, counted again in the write transaction (which SQLite serializes; on PostgreSQL
                # concurrent submissions may still pass it together by a few, as with any count-then-insert).
                queued = Job.objects.filter(team=team, state=JobState.QUEUED).count()
                _refuse_if_queue_full(team, queued, limits.max_queued_jobs)
            now = timezone.now()
            job = Job(
                team=team,
                user=user,
                name=name.strip(),
                image=container_image.name,
                command=argv,
                env=clean_env,
                mounts=clean_mounts,
                gpu_count=gpu_count,
                gpu_models=models,
                cpus=cpus_value,
                memory_mib=memory,
                max_duration_s=duration,
                priority=priority,
                reservation=reservation,
                idempotency_key=idempotency_key or "",
            )
            event = JobEvent(at=now, from_state="", to_state=JobState.QUEUED)
            rawsql.insert_with_child(job, event, "job_id")  # one round trip on PostgreSQL
            event.job = job
            if reservation is None:
                # A job inside a reservation runs on hours the reservation already counted.
                occupancy.quota_hold(job=job, start=now, end=now + timedelta(seconds=duration), quotas=quotas)
            events.wake_scheduler_on_commit("submitted")
    except IntegrityError:
        if idempotency_key:
            existing = Job.objects.filter(user=user, idempotency_key=idempotency_key).first()
            if existing is not None:
                return existing
        raise
    logger.info("job %s queued by %s for team %s", job.pk, user, team.slug)
    # The caller shows the job it just queued: its timeline is that one event and it holds no GPU yet, so the
    # detail serializer needs no query for them (what a prefetch would have cached).
    _prime_related(job, "events", JobEvent, [event])
    _prime_related(job, "gpus", Gpu, [])
    return job


def _prime_related(job: Job, name: str, model: type[Any], rows: list[Any]) -> None:
    qs = model.objects.all()
    qs._result_cache = rows  # as prefetch_related_objects stores a prefetched relation
    qs._prefetch_done = True
    cache = getattr(job, "_prefetched_objects_cache", None)
    if cache is None:
        cache = {}
        setattr(job, "_prefetched_objects_cache", cache)  # noqa: B010 - Django's attribute, not declared on Job
    cache[name] = qs


# --- The state machine ------------------------------------------------------------------------------------


def _clamp(at: datetime | None, lo: datetime | None, hi: datetime) -> datetime:
    """A node's timestamp, kept inside what the portal knows is possible (clocks drift)."""
    value = at or hi
    if lo is not None and value < lo:
        value = lo
    return min(value, hi)


def job_transition(
    job: Job,
    to_state: str,
    *,
    reason: str = "",
    exit_code: int | None = None,
    message: str = "",
    at: datetime | None = None,
    allocation_end: datetime | None = None,
    update: Mapping[str, Any] | None = None,
    savepoint: bool = True,
) -> Job:
    """Move `job` to `to_state`, or raise TransitionRefused.

    A conditional UPDATE ... WHERE state = <current>: under concurrency exactly one of two racing transitions
    changes the row; the loser re-reads the state and is refused unless the move is still legal from there.
    In the same transaction: a JobEvent, timestamps, and for a final state the allocations cut at the end
    (`allocation_end`, e.g. the node's last heartbeat for a lost job) and the quota settled to the real runtime.
    After commit: a websocket broadcast and, for a final state, a scheduler wake-up.
    Nested in a caller's transaction it runs in a savepoint (the caller may catch a refusal and go on);
    `savepoint=False` for a caller with its own savepoint around this call (two round trips less).
    """
    if to_state not in JobState.values:
        raise ValidationFailed(f"Unknown state {to_state!r}.")
    now = timezone.now()
    with transaction.atomic(savepoint=savepoint):
        current = job.state
        for _ in range(3):
            if to_state not in TRANSITIONS.get(current, frozenset()):
                raise TransitionRefused(f"Job {job.pk} is {current}; it cannot become {to_state}.")
            fields: dict[str, Any] = {"state": to_state, "updated_at": now, **(update or {})}
            if to_state == JobState.RUNNING:
                fields["started_at"] = _clamp(at, job.scheduled_at, now)
            if to_state in TERMINAL_STATES:
                started = fields.get("started_at", job.started_at)
                fields["ended_at"] = _clamp(at, started or job.scheduled_at, now)
                fields["reason"] = reason
                fields["exit_code"] = exit_code
                fields["message"] = message[:4000]
                fields["pending_reason"] = ""
                fields["pending_message"] = ""
                if started is None and to_state != JobState.LOST and job.scheduled_at is not None:
                    # It ended before the "started" report arrived: count it as started when scheduled.
                    fields["started_at"] = job.scheduled_at
            if rawsql.update(Job, {"id": job.pk, "state": current}, fields) == 1:
                break
            # Someone else moved it: re-read the whole row (the next attempt computes from fresh values).
            try:
                job.refresh_from_db()
            except Job.DoesNotExist:
                raise NotFound(f"Job {job.pk} no longer exists.") from None
            current = job.state
        else:
            raise TransitionRefused(f"Job {job.pk} changed state concurrently; try again.")
        for name, value in fields.items():
            setattr(job, name, value)
        timeline = []
        if current == JobState.STARTING and to_state in TERMINAL_STATES and job.started_at is not None:
            # It ran (briefly) before anyone heard it had started: the timeline says so.
            timeline.append(JobEvent(job=job, at=job.started_at, from_state=current, to_state=JobState.RUNNING))
            current = JobState.RUNNING
        timeline.append(
            JobEvent(job=job, at=now, from_state=current, to_state=to_state, reason=reason, message=message[:4000])
        )
        rawsql.insert(timeline)
        if to_state in TERMINAL_STATES:
            end = job.ended_at or now
            if allocation_end is not None:
                end = allocation_end
            occupancy.release(job=job, end=max(end, job.scheduled_at or end))
            if job.reservation_id is None:
                occupancy.quota_settle(job=job, start=job.started_at, end=job.ended_at if job.started_at else None)
            events.wake_scheduler_on_commit("ended")
        events.broadcast_state_on_commit(job)
    return job


# --- Starting (the scheduler) ----------------------------------------------------------------------------------


def launch_request(job: Job, gpus: Sequence[Gpu]) -> dict[str, Any]:
    """What the node agent gets: exactly the fields workers/runtimes/policy.py understands."""
    return {
        "job_id": job.pk,
        "image": job.image,
        "command": list(job.command),
        "env": dict(job.env),
        "gpu_uuids": [g.uuid for g in gpus],
        "cpus": float(job.cpus),
        "memory_mib": job.memory_mib,
        "max_duration_s": job.max_duration_s,
        "mounts": list(job.mounts),
        "network": "none",
    }


def job_start(*, job: Job, node: Node, gpus: Sequence[Gpu], now: datetime, savepoint: bool = True) -> Job:
    """queued → starting on `gpus` of `node`: allocations (outside a reservation), then the launch command.

    Raises Conflict when a GPU is already held (the allocation constraint) and TransitionRefused when the job is no
    longer queued; nothing of it stays. The launch is sent after commit. Nested, it runs in one savepoint;
    `savepoint=False` for a caller that has its own around the call (the scheduler: one start of a pass that
    may fail while the others go on), which saves the three nested savepoints' six round trips.
    """
    from apps.fleet.commands import agent_send

    with transaction.atomic(savepoint=savepoint):
        price = sum((g.model.hourly_price for g in gpus), Decimal("0"))
        job = job_transition(
            job,
            JobState.STARTING,
            update={
                "node": node,
                "scheduled_at": now,
                "launch_sent_at": now,
                "launch_attempts": 1,
                "hourly_price": price,
                "pending_reason": "",
                "pending_message": "",
            },
            savepoint=False,  # inside this function's own transaction or savepoint, or the caller's
        )
        Job.gpus.through.objects.bulk_create([Job.gpus.through(job_id=job.pk, gpu_id=g.pk) for g in gpus])
        if job.reservation_id is None:
            end = now + timedelta(seconds=job.max_duration_s + conf.ALLOCATION_SLACK_S)
            occupancy.allocate(job=job, gpus=gpus, start=now, end=end, savepoint=False)
        agent_send(node=node, task="agent.launch_job", body=launch_request(job, gpus))
    return job


@dataclass(frozen=True)
class StartItem:
    job: Job
    node: Node
    gpus: Sequence[Gpu]


def jobs_start_many(*, items: Sequence[StartItem], now: datetime, savepoint: bool = True) -> list[int]:
    """queued → starting for many jobs in a handful of statements: what `job_start` does for each, batched.

    For the scheduler's common case (no reservation, no concurrent-GPU quota: the caller checks), where a pass
    starts tens of jobs and one savepoint, UPDATE, event and allocation insert per job was most of its time.
    All or nothing: raises Conflict when a GPU is held meanwhile or a job is no longer queued, and the caller (in
    a savepoint) starts them one by one to learn which. Returns the started ids; launches are sent after commit.
    `savepoint` as for `job_start`.
    """
    from apps.booking import services as booking
    from apps.booking.models import AllocationKind
    from apps.fleet.commands import agent_send

    if not items:
        return []
    ids = [item.job.pk for item in items]
    with transaction.atomic(savepoint=savepoint):
        # The row locks make the state check and the UPDATEs below one step, as job_transition's conditional
        # UPDATE does for one job (a cancel racing a start waits here, then finds the job starting).
        where, params = rawsql.in_clause("id", ids)
        # Hand-written (the compiled ORM query was a tenth of the scheduler's CPU); FOR UPDATE where there is one
        # (SQLite's write transaction already holds the whole database).
        sql = f"SELECT id FROM {Job._meta.db_table} WHERE {where} AND state = %s ORDER BY id"  # noqa: S608
        if connection.vendor == "postgresql":
            sql += " FOR UPDATE"
        queued = {row[0] for row in rawsql.fetch_all(sql, [*params, JobState.QUEUED])}
        if len(queued) != len(ids):
            raise TransitionRefused("A job of this pass is no longer queued.")
        by_target: dict[tuple[int, Decimal], list[int]] = {}
        prices: dict[int, Decimal] = {}
        for item in items:
            price = sum((g.model.hourly_price for g in item.gpus), Decimal("0"))
            prices[item.job.pk] = price
            by_target.setdefault((item.node.pk, price), []).append(item.job.pk)
        common = {
            "state": JobState.STARTING,
            "updated_at": now,
            "scheduled_at": now,
            "launch_sent_at": now,
            "launch_attempts": 1,
            "pending_reason": "",
            "pending_message": "",
        }
        for (node_id, price), job_ids in by_target.items():
            rawsql.update(Job, {"id": job_ids}, {"node_id": node_id, "hourly_price": price, **common})
        rawsql.insert(
            [JobEvent(job_id=pk, at=now, from_state=JobState.QUEUED, to_state=JobState.STARTING) for pk in ids]
        )
        rawsql.insert([Job.gpus.through(job_id=item.job.pk, gpu_id=g.pk) for item in items for g in item.gpus])
        booking.allocations_create_many(
            [
                booking.AllocationRequest(
                    gpu_ids=[g.pk for g in item.gpus],
                    team=item.job.team,
                    user=item.job.user,
                    start=now,
                    end=now + timedelta(seconds=item.job.max_duration_s + conf.ALLOCATION_SLACK_S),
                    kind=AllocationKind.JOB,
                    job_id=item.job.pk,
                )
                for item in items
            ],
            savepoint=False,  # inside this function's own transaction or savepoint, or the caller's
        )
        for item in items:
            job = item.job
            for name, value in common.items():
                setattr(job, name, value)
            job.node = item.node
            job.hourly_price = prices[job.pk]
            events.broadcast_state_on_commit(job)
            agent_send(node=item.node, task="agent.launch_job", body=launch_request(job, item.gpus))
    return ids


def job_resend_launch(*, job: Job) -> None:
    """Send the launch again (the first message may have died with Redis); the agent ignores a duplicate."""
    from apps.fleet.commands import agent_send

    if job.node is None:
        return
    with transaction.atomic():
        updated = Job.objects.filter(pk=job.pk, state=JobState.STARTING).update(
            launch_sent_at=timezone.now(), launch_attempts=job.launch_attempts + 1
        )
        if updated:
            agent_send(node=job.node, task="agent.launch_job", body=launch_request(job, list(job.gpus.all())))


# --- Cancelling ------------------------------------------------------------------------------------------


def job_request_stop(*, job: Job, reason: str, grace_s: float) -> None:
    """Ask the job's node to stop it (SIGTERM, grace, SIGKILL); the node's exit report ends it."""
    from apps.fleet.commands import agent_send

    with transaction.atomic():
        Job.objects.filter(pk=job.pk, state__in=ON_NODE_STATES).update(
            stop_reason=reason, stop_requested_at=timezone.now()
        )
        if job.node is not None:
            agent_send(node=job.node, task="agent.cancel_job", body={"job_id": job.pk, "grace_s": float(grace_s)})


def job_cancel(*, job: Job, user: Any) -> Job:
    """Cancel a job: a queued one at once; one on a node is stopped there and ends when the node says so.

    The user must be the submitter, a manager of the team, or staff (teammates may watch, not cancel).
    Cancelling a finished job is refused (409); cancelling twice is harmless.
    """
    from apps.accounts.scoping import managed_team_ids_of

    if not (user.is_staff or job.user_id == user.pk or job.team_id in managed_team_ids_of(user)):
        raise Forbidden("Only the submitter, a team manager or an admin may cancel this job.")
    if job.state == JobState.QUEUED:
        try:
            return job_transition(job, JobState.CANCELLED, reason=JobReason.CANCELLED, message=f"cancelled by {user}")
        except TransitionRefused:
            job.refresh_from_db()
    if job.state in ON_NODE_STATES:
        job_request_stop(job=job, reason=JobReason.CANCELLED, grace_s=conf.CANCEL_GRACE_S)
        job.refresh_from_db()
        return job
    raise Conflict(f"Job {job.pk} has already ended ({job.state}).", code="job_finished")


# --- Reports from nodes ----------------------------------------------------------------------------------------


def _job_on_node(job_id: int, node_id: int) -> Job | None:
    """The job with its node, if the portal placed it on this node (a node may only report on its own jobs).

    Hand-written SQL: every report of every job starts here, and compiling the ORM query cost the worker more CPU
    than running it."""

    job_cols, node_cols = rawsql.columns(Job, "j"), rawsql.columns(Node, "n")
    # Table and column names from the models' metadata; the ids are parameters.
    sql = f"SELECT {job_cols.sql}, {node_cols.sql} FROM {Job._meta.db_table} j "  # noqa: S608
    sql += f"JOIN {Node._meta.db_table} n ON n.id = j.node_id WHERE j.id = %s AND j.node_id = %s"
    row = rawsql.fetch_one(sql, [job_id, node_id])
    if row is None:
        return None
    job: Job = job_cols.load(row)
    Job.node.field.set_cached_value(job, node_cols.load(row, job_cols.width))  # as select_related("node") does
    return job


def job_report_started(*, node_id: int, job_id: int, handle: str, at: datetime | None) -> str:
    """The node started the job: "running" (applied, or already so), "ignored" (the node's own exit report got
    there first, or the job is not this node's), or "stop" (the portal ended it meanwhile: the caller stops it)."""
    job = _job_on_node(job_id, node_id)
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
    job = _job_on_node(job_id, node_id)
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
        update["started_at"] = _clamp(started_at, job.scheduled_at, timezone.now())
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


def job_mark_lost(*, job: Job, message: str, allocation_end: datetime | None) -> bool:
    """starting/running → lost (node_lost); the GPUs are free from `allocation_end` (the last heartbeat)."""
    try:
        job_transition(job, JobState.LOST, reason=JobReason.NODE_LOST, message=message, allocation_end=allocation_end)
    except TransitionRefused:
        return False
    return True


def job_fail_launch(*, job: Job, message: str) -> bool:
    try:
        job_transition(job, JobState.FAILED, reason=JobReason.LAUNCH_ERROR, message=message)
    except TransitionRefused:
        return False
    return True


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
