"""The ORM shell around the pure scheduling core: leader election, snapshot, decisions applied in one transaction.

`python manage.py scheduler` runs `SchedulerLoop`. One process at a time is the leader:

- PostgreSQL: `pg_try_advisory_lock` on a dedicated connection (not Django's, so no transaction handling can drop
  it); the lock lives as long as that connection, so when a leader dies the server frees it and a waiting
  process takes over within a second.
- SQLite (embedded default): a Redis lock with an expiry, renewed every pass; a leader that stops renewing loses
  it after `LEASE_S`.

Either way each leadership gets a fencing token (a Redis counter, or the advisory lock's own epoch stored in the
`SchedulerState` row): the apply transaction first moves `SchedulerState.fence` to its token with a conditional
UPDATE and gives up if a newer leader already wrote there, so a paused ex-leader cannot apply stale decisions.

A pass runs every `interval` seconds and when a service pushes to the Redis list `jobs:scheduler:wake` (job
submitted or ended, reservation ended). It loads a snapshot (GPUs of online nodes, running jobs, reservations
and maintenance windows, queued jobs, decayed team usage), calls `apps.jobs.scheduling.schedule`, and applies
the starts and stops in ONE transaction: each start in a savepoint, with booking's allocation constraint as the
last guard (a start that loses the race stays queued). Launch and stop commands leave after commit.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.models import Team
from apps.booking.models import Allocation, AllocationKind, MaintenanceWindow, Reservation, ReservationStatus
from apps.core import rawsql
from apps.core.errors import ApplicationError
from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus
from apps.jobs import conf, occupancy, services
from apps.jobs.events import WAKE_KEY
from apps.jobs.models import ON_NODE_STATES, Job, JobReason, JobState, SchedulerState
from apps.jobs.scheduling import (
    Decisions,
    Policy,
    ReasonCode,
    Snapshot,
    StopReason,
    decayed_gpu_seconds,
    policy_by_name,
    schedule,
)
from apps.jobs.scheduling import Gpu as CoreGpu
from apps.jobs.scheduling import PendingJob as CorePending
from apps.jobs.scheduling import Reservation as CoreReservation
from apps.jobs.scheduling import RunningJob as CoreRunning

logger = logging.getLogger(__name__)

ADVISORY_KEY = 0x4A4F4253  # "JOBS"
LEASE_KEY = "jobs:scheduler:leader"
FENCE_KEY = "jobs:scheduler:fence"
LEASE_S = 5.0
MAX_PENDING = 20_000
USAGE_REFRESH_S = 30.0
MAINTENANCE_TEAM = "__maintenance__"
SWEEP_EVERY_S = 2.0
WAKE_BATCH_S = 0.02


def epoch(moment: datetime) -> float:
    return moment.timestamp()


# --- Leadership ---------------------------------------------------------------------------------------------


class Leadership(Protocol):
    token: int

    def acquire(self) -> bool:
        """Try to become leader (non-blocking); True if this process is the leader now."""
        ...

    def still_leader(self) -> bool:
        """Renew/check the leadership before a pass."""
        ...

    def release(self) -> None: ...


class PostgresLeadership:
    """`pg_try_advisory_lock` held by a dedicated psycopg connection for as long as this process leads."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.token = 0

    def _connect(self) -> Any:
        import psycopg

        db = settings.DATABASES["default"]
        return psycopg.connect(
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            dbname=db["NAME"],
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            autocommit=True,
            connect_timeout=5,
            application_name="gpu-portal-scheduler-lock",
        )

    def acquire(self) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self._connect()
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY]).fetchone()
        except Exception as exc:
            logger.warning("scheduler lock: %s", exc)
            self._drop()
            return False
        if not row or not row[0]:
            return False
        # The token: one more than any leader before (the fence row's value), taken while holding the lock.
        self.token = _next_fence()
        return True

    def still_leader(self) -> bool:
        if self.conn is None:
            return False
        try:
            self.conn.execute("SELECT 1").fetchone()
            return True
        except Exception as exc:
            logger.warning("scheduler lock connection lost: %s", exc)
            self._drop()
            return False

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: S110 - already broken
                pass
        self.conn = None

    def release(self) -> None:
        if self.conn is not None:
            try:
                self.conn.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])
            except Exception:  # noqa: S110 - closing the connection frees it anyway
                pass
        self._drop()


_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class RedisLeadership:
    """A Redis lease (SET NX PX) renewed every pass; the value is this leadership's fencing token."""

    def __init__(self, redis: Any, lease_s: float = LEASE_S) -> None:
        self.redis = redis
        self.lease_ms = int(lease_s * 1000)
        self.token = 0

    def acquire(self) -> bool:
        try:
            if self.token and self.still_leader():
                return True
            token = int(self.redis.incr(FENCE_KEY))
            if self.redis.set(LEASE_KEY, str(token), nx=True, px=self.lease_ms):
                # A Redis that restarted empty counts from 1 again: stay above every token the database saw.
                fence = SchedulerState.objects.filter(pk=1).values_list("fence", flat=True).first() or 0
                if token <= fence:
                    token = fence + 1
                    self.redis.set(FENCE_KEY, str(token))
                    self.redis.set(LEASE_KEY, str(token), xx=True, px=self.lease_ms)
                self.token = token
                return True
        except Exception as exc:
            logger.warning("scheduler lease: %s", exc)
        self.token = 0
        return False

    def still_leader(self) -> bool:
        if not self.token:
            return False
        try:
            return bool(self.redis.eval(_RENEW, 1, LEASE_KEY, str(self.token), self.lease_ms))
        except Exception as exc:
            logger.warning("scheduler lease renewal failed: %s", exc)
            return False

    def release(self) -> None:
        if self.token:
            try:
                self.redis.eval(_RELEASE, 1, LEASE_KEY, str(self.token))
            except Exception:  # noqa: S110 - it expires by itself
                pass
        self.token = 0


def _next_fence() -> int:
    with transaction.atomic():
        state, _ = SchedulerState.objects.select_for_update().get_or_create(pk=1)
        return state.fence + 1


def default_leadership() -> Leadership:
    if settings.IS_POSTGRES:
        return PostgresLeadership()
    from apps.core.redis import get_redis

    return RedisLeadership(get_redis())


class NotLeader(Exception):
    """A newer leader has applied decisions since this one took over: stop applying."""


# --- Snapshot --------------------------------------------------------------------------------------------------


@dataclass
class RunningRow:
    """What a pass reads of a job on a node."""

    id: int
    team_id: int
    started_at: datetime | None
    scheduled_at: datetime | None
    max_duration_s: int
    reservation_id: int | None
    stop_requested_at: datetime | None


@dataclass(frozen=True)
class GpuRow:
    """What a pass reads of a schedulable GPU (plain values: the apply step loads model instances of the GPUs it
    starts jobs on, not of the whole fleet on every pass)."""

    id: int
    node_id: int
    node: str
    model: str


@dataclass
class PassContext:
    """The snapshot plus the rows the apply step needs, keyed by the core's string ids."""

    now: datetime
    snapshot: Snapshot
    gpus: dict[str, GpuRow] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)  # node name -> id
    pending: dict[str, Job] = field(default_factory=dict)
    running: dict[str, RunningRow] = field(default_factory=dict)
    reservation_ends: dict[str, datetime] = field(default_factory=dict)


class UsageCache:
    """Decayed GPU-seconds per team, recomputed from job rows at most every USAGE_REFRESH_S."""

    def __init__(self, half_life_s: float = conf.FAIRSHARE_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.value: dict[str, float] = {}
        self.at = 0.0

    def get(self, now: datetime) -> dict[str, float]:
        if time.monotonic() - self.at < USAGE_REFRESH_S and self.value:
            return self.value
        horizon = now - timedelta(seconds=self.half_life_s * 4)
        if connection.vendor == "postgresql":
            usage = team_usage_in_sql(now=now, horizon=horizon, half_life_s=self.half_life_s)
        else:
            usage = team_usage_in_python(now=now, horizon=horizon, half_life_s=self.half_life_s)
        self.value = usage
        self.at = time.monotonic()
        return usage


def team_usage_in_python(*, now: datetime, horizon: datetime, half_life_s: float) -> dict[str, float]:
    """Decayed GPU-seconds per team of the jobs that ran since `horizon` (the reference; SQLite)."""
    now_s = epoch(now)
    usage: dict[str, float] = {}
    rows = (
        Job.objects.filter(started_at__isnull=False)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=horizon))
        .values_list("team_id", "gpu_count", "started_at", "ended_at")
    )
    for team_id, gpus, started, ended in rows.iterator(chunk_size=2000):
        if started is None:
            continue
        end = epoch(ended) if ended else now_s
        key = str(team_id)
        usage[key] = usage.get(key, 0.0) + decayed_gpu_seconds(gpus, epoch(started), end, now_s, half_life_s)
    return usage


def team_usage_in_sql(*, now: datetime, horizon: datetime, half_life_s: float) -> dict[str, float]:
    """`team_usage_in_python` summed by PostgreSQL: one row per team instead of one per job of the last four
    half-lives (hundreds of thousands on a busy installation, read into Python every USAGE_REFRESH_S and holding
    up that pass). The same integral as `decayed_gpu_seconds`; exponents are floored at -700 (exp underflows to an
    error in PostgreSQL below about -745, and the term is 0 there anyway)."""
    lam = math.log(2.0) / half_life_s
    sql = (
        "SELECT team_id, SUM(gpu_count * (EXP(GREATEST(-700.0, -%(lam)s * EXTRACT(EPOCH FROM (%(now)s - e)))) "  # noqa: S608
        "- EXP(GREATEST(-700.0, -%(lam)s * EXTRACT(EPOCH FROM (%(now)s - started_at))))) / %(lam)s) "
        f"FROM (SELECT team_id, gpu_count, started_at, LEAST(COALESCE(ended_at, %(now)s), %(now)s) AS e "
        f"FROM {Job._meta.db_table} WHERE started_at IS NOT NULL AND (ended_at IS NULL OR ended_at > %(horizon)s)) j "
        "WHERE e > started_at GROUP BY team_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {"lam": lam, "now": now, "horizon": horizon})
        return {str(team_id): float(value) for team_id, value in cursor.fetchall()}


def _snapshot_sql() -> dict[str, str]:
    """The snapshot's queries, written by hand: compiling eight ORM queries was most of an idle pass's CPU (and an
    idle pass runs every second). Table names from the models' metadata; every value is a parameter."""
    q = connection.ops.quote_name
    job, job_gpus = Job._meta.db_table, Job.gpus.through._meta.db_table
    alloc, resv, window = Allocation._meta.db_table, Reservation._meta.db_table, MaintenanceWindow._meta.db_table
    gpu, node, model = Gpu._meta.db_table, Node._meta.db_table, GpuModel._meta.db_table
    return {
        "gpus": (
            f"SELECT g.id, g.node_id, n.name, m.name FROM {gpu} g JOIN {node} n ON n.id = g.node_id "  # noqa: S608
            f"JOIN {model} m ON m.id = g.model_id WHERE g.retired_at IS NULL AND g.status = %s AND n.status = %s "
            # A node without a token cannot verify a launch command: nothing is placed there.
            "AND n.draining = %s AND n.token_digest <> '' ORDER BY g.id"
        ),
        "running": (
            "SELECT id, team_id, started_at, scheduled_at, max_duration_s, reservation_id, stop_requested_at "  # noqa: S608
            f"FROM {job} WHERE state IN (%s, %s) ORDER BY id"
        ),
        "held_by": (
            f"SELECT jg.job_id, jg.gpu_id FROM {job_gpus} jg JOIN {job} j ON j.id = jg.job_id "  # noqa: S608
            "WHERE j.state IN (%s, %s) ORDER BY jg.gpu_id"
        ),
        "held_now": (
            f"SELECT DISTINCT gpu_id FROM {alloc} WHERE active = %s AND kind = %s AND start <= %s AND {q('end')} > %s"  # noqa: S608
        ),
        "reservations": (
            f"SELECT id, team_id, start, {q('end')} FROM {resv} WHERE (status IN (%s, %s) AND {q('end')} > %s) "  # noqa: S608
            f"OR id IN (SELECT DISTINCT reservation_id FROM {job} WHERE state IN (%s, %s) AND reservation_id "
            "IS NOT NULL) ORDER BY id"
        ),
        "reservation_gpus": f"SELECT reservation_id, gpu_id FROM {alloc} WHERE kind = %s AND reservation_id IN ",  # noqa: S608
        "windows": f"SELECT id, gpu_id, node_id, start, {q('end')} FROM {window} WHERE {q('end')} > %s ORDER BY id",  # noqa: S608
        "shares": f"SELECT id, share FROM {Team._meta.db_table}",  # noqa: S608
    }


_SQL: dict[str, str] = {}


def _sql(name: str) -> str:
    if not _SQL:
        _SQL.update(_snapshot_sql())
    return _SQL[name]


def _dt(model: Any, name: str, value: Any) -> Any:
    convert = rawsql.field_converter(model, name)
    return convert(value) if convert is not None and value is not None else value


def load_snapshot(now: datetime, usage: UsageCache | None = None) -> PassContext:
    """Read everything one pass needs (a handful of queries, no query per job)."""
    ctx = PassContext(now=now, snapshot=Snapshot(gpus=(), pending=()))
    at = rawsql.datetime_param(now)
    on_node = sorted(ON_NODE_STATES)
    # The fleet as plain rows: model instances of every GPU with its node and model, on every pass, grew with the
    # fleet; the apply step loads instances of the GPUs it starts jobs on.
    gpu_rows = [GpuRow(*row) for row in rawsql.fetch_all(_sql("gpus"), [GpuStatus.OK, NodeStatus.ONLINE, False])]
    ctx.gpus = {str(g.id): g for g in gpu_rows}
    ctx.nodes = {g.node: g.node_id for g in gpu_rows}

    # Running jobs as plain rows (every pass reads them all; model instances with their JSON fields and a GPU
    # prefetch were about a quarter of a pass's CPU). A stop, rare, loads its job.
    running_rows = [
        RunningRow(
            id=r[0],
            team_id=r[1],
            started_at=_dt(Job, "started_at", r[2]),
            scheduled_at=_dt(Job, "scheduled_at", r[3]),
            max_duration_s=r[4],
            reservation_id=r[5],
            stop_requested_at=_dt(Job, "stop_requested_at", r[6]),
        )
        for r in rawsql.fetch_all(_sql("running"), on_node)
    ]
    ctx.running = {str(r.id): r for r in running_rows}
    held_by: dict[int, list[str]] = {}
    for job_id, gpu_id in rawsql.fetch_all(_sql("held_by"), on_node):
        held_by.setdefault(job_id, []).append(str(gpu_id))
    running: list[CoreRunning] = []
    for row in running_rows:
        start = row.started_at or row.scheduled_at or now
        running.append(
            CoreRunning(
                id=str(row.id),
                team=str(row.team_id),
                gpu_ids=tuple(held_by.get(row.id, ())),
                start=epoch(start),
                max_duration_s=float(row.max_duration_s),
                reservation_id=str(row.reservation_id) if row.reservation_id else None,
            )
        )

    # A GPU held now by an allocation the snapshot cannot explain (a job row that ended without cutting it, a
    # hold of some other kind) is not free.
    explained = {int(gid) for r in running for gid in r.gpu_ids}
    held_now = {r[0] for r in rawsql.fetch_all(_sql("held_now"), [True, AllocationKind.JOB, at, at])}
    blocked = held_now - explained

    # Reservations: booked/active ones not over yet, and those of running jobs (even released: the core stops
    # their jobs once the reservation's end has passed).
    resv_rows = [
        (r[0], r[1], _dt(Reservation, "start", r[2]), _dt(Reservation, "end", r[3]))
        for r in rawsql.fetch_all(
            _sql("reservations"), [ReservationStatus.BOOKED, ReservationStatus.ACTIVE, at, *on_node]
        )
    ]
    resv_gpus: dict[int, set[str]] = {}
    if resv_rows:
        marks = ", ".join(["%s"] * len(resv_rows))
        sql = f"{_sql('reservation_gpus')}({marks})"
        for rid, gid in rawsql.fetch_all(sql, [AllocationKind.RESERVATION, *(r[0] for r in resv_rows)]):
            resv_gpus.setdefault(rid, set()).add(str(gid))
    reservations = [
        CoreReservation(str(rid), str(team_id), frozenset(resv_gpus.get(rid, ())), epoch(begin), epoch(end))
        for rid, team_id, begin, end in resv_rows
    ]
    ctx.reservation_ends = {str(rid): end for rid, _, _, end in resv_rows}

    # Maintenance windows behave as reservations of nobody: a job must be done before one starts.
    node_gpus: dict[int, list[str]] = {}
    for key, gpu_row in ctx.gpus.items():
        node_gpus.setdefault(gpu_row.node_id, []).append(key)
    for wid, gpu_id, node_id, begin, end in rawsql.fetch_all(_sql("windows"), [at]):
        if gpu_id:
            ids = [str(gpu_id)]
        elif node_id:
            ids = node_gpus.get(node_id, [])
        else:
            ids = list(ctx.gpus)
        if ids:
            reservations.append(
                CoreReservation(
                    f"m{wid}",
                    MAINTENANCE_TEAM,
                    frozenset(ids),
                    epoch(_dt(MaintenanceWindow, "start", begin)),
                    epoch(_dt(MaintenanceWindow, "end", end)),
                )
            )

    pending_rows = _pending_jobs()
    ctx.pending = {str(j.pk): j for j in pending_rows}
    pending = [
        CorePending(
            id=str(j.pk),
            team=str(j.team_id),
            user=str(j.user_id),
            gpu_count=j.gpu_count,
            max_duration_s=float(j.max_duration_s),
            submitted_at=epoch(j.submitted_at),
            models=frozenset(j.gpu_models) if j.gpu_models else None,
            priority=j.priority,
            reservation_id=str(j.reservation_id) if j.reservation_id else None,
        )
        for j in pending_rows
    ]
    gpus = tuple(
        CoreGpu(id=gid, node=g.node, model=g.model, free=0.0 if g.id in blocked else 1.0) for gid, g in ctx.gpus.items()
    )
    shares = {str(pk): float(share) for pk, share in rawsql.fetch_all(_sql("shares"), [])}
    ctx.snapshot = Snapshot(
        gpus=gpus,
        pending=tuple(pending),
        running=tuple(running),
        reservations=tuple(reservations),
        team_usage=(usage or UsageCache()).get(now) if pending else {},
        team_shares=shares,
    )
    return ctx


def _pending_jobs() -> list[Job]:
    """Queued jobs in arrival order with their team and user (the apply step books allocations for them), as
    instances: the start transitions work on them."""
    user_model = Job.user.field.related_model
    job_cols, team_cols = rawsql.columns(Job, "j"), rawsql.columns(Team, "t")
    user_cols = rawsql.columns(user_model, "u")  # type: ignore[arg-type]
    sql = (
        f"SELECT {job_cols.sql}, {team_cols.sql}, {user_cols.sql} FROM {Job._meta.db_table} j "  # noqa: S608
        f"JOIN {Team._meta.db_table} t ON t.id = j.team_id "
        f"JOIN {user_model._meta.db_table} u ON u.id = j.user_id "  # type: ignore[union-attr]
        "WHERE j.state = %s ORDER BY j.submitted_at, j.id LIMIT %s"
    )
    jobs: list[Job] = []
    for row in rawsql.fetch_all(sql, [JobState.QUEUED, MAX_PENDING]):
        job: Job = job_cols.load(row)
        # As select_related("team", "user") caches them.
        Job.team.field.set_cached_value(job, team_cols.load(row, job_cols.width))
        Job.user.field.set_cached_value(job, user_cols.load(row, job_cols.width + team_cols.width))
        jobs.append(job)
    return jobs


# --- Apply -----------------------------------------------------------------------------------------------------


@dataclass
class PassResult:
    started: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    pending: int = 0
    ms: float = 0.0


def _claim_fence(token: int, leader: str, now: datetime) -> None:
    """Move the fence to our token; a newer leader's token there means we are not the leader any more."""
    # By hand, as the snapshot's queries: this runs on every pass, idle ones included.
    sql = f"UPDATE {SchedulerState._meta.db_table} SET fence = %s, leader = %s WHERE id = 1 AND fence <= %s"  # noqa: S608
    updated = rawsql.execute(sql, [token, leader[:200], token])
    if not updated:
        # The row is made once (a new installation), not looked up on every pass.
        _, created = SchedulerState.objects.get_or_create(pk=1)
        if created:
            updated = rawsql.execute(sql, [token, leader[:200], token])
    if not updated:
        raise NotLeader(f"a leader with a token above {token} has taken over")


def apply_decisions(ctx: PassContext, decisions: Decisions, *, token: int, leader: str) -> PassResult:
    """Apply one pass's decisions in one transaction (plain starts in one batch, the others each in a savepoint)."""
    result = PassResult(pending=len(ctx.pending))
    now = ctx.now
    grace = _reservation_grace_s()
    with transaction.atomic():
        _claim_fence(token, leader, now)
        items: list[services.StartItem] = []
        gpu_by_id, node_by_id = _instances_for(ctx, decisions)
        for start in decisions.starts:
            job = ctx.pending.get(start.job_id)
            node = node_by_id.get(ctx.nodes.get(start.node, 0))
            chosen = [gpu_by_id.get(int(g)) for g in start.gpu_ids]
            if job is None or node is None or any(g is None for g in chosen):
                continue  # a GPU or node deleted since the snapshot: the next pass sees the fleet as it is
            items.append(services.StartItem(job=job, node=node, gpus=[g for g in chosen if g is not None]))
        # Most starts need nothing but their allocations: those go in one batch. Jobs in a reservation (no
        # allocation) or of a team with a concurrent-GPU cap (a quota check each) go one by one, and so does
        # the whole batch when any of it is refused (a GPU taken meanwhile, a job cancelled), to learn which.
        batch: list[services.StartItem] = []
        one_by_one: list[services.StartItem] = []
        for item in items:
            plain = item.job.reservation_id is None and not occupancy.team_limits_concurrency(item.job.team_id)
            (batch if plain else one_by_one).append(item)
        if len(batch) > 1:
            try:
                # This savepoint is the one a failed batch rolls back to; the service adds none of its own.
                with transaction.atomic():
                    result.started.extend(services.jobs_start_many(items=batch, now=now, savepoint=False))
            except ApplicationError:
                one_by_one = items
        else:
            one_by_one = items
        for item in one_by_one:
            job, node, gpus = item.job, item.node, item.gpus
            try:
                with transaction.atomic():
                    services.job_start(job=job, node=node, gpus=gpus, now=now, savepoint=False)
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
            services.job_request_stop(job=job, reason=reason, grace_s=conf.CANCEL_GRACE_S)
            result.stopped.append(job.pk)
        _store_reasons(ctx, decisions, result)
    return result


def _instances_for(ctx: PassContext, decisions: Decisions) -> tuple[dict[int, Gpu], dict[int, Node]]:
    """The GPUs (with their model: prices) and nodes (token digest: signing) this pass starts jobs on."""
    gpu_ids = sorted({int(g) for start in decisions.starts for g in start.gpu_ids})
    if not gpu_ids:
        return {}, {}
    node_ids = sorted({ctx.nodes[start.node] for start in decisions.starts if start.node in ctx.nodes})
    # Hand-written (what select_related("model").in_bulk() and in_bulk() would load): compiling those two ORM
    # queries was a sixth of the scheduler's CPU. Table and column names from the models' metadata.
    gpu_cols, model_cols, node_cols = rawsql.columns(Gpu, "g"), rawsql.columns(GpuModel, "m"), rawsql.columns(Node, "n")
    quote = connection.ops.quote_name
    model_fk = quote(Gpu._meta.get_field("model").column)
    where, params = rawsql.in_clause("g.id", gpu_ids)
    sql = f"SELECT {gpu_cols.sql}, {model_cols.sql} FROM {quote(Gpu._meta.db_table)} g "  # noqa: S608
    sql += f"JOIN {quote(GpuModel._meta.db_table)} m ON m.id = g.{model_fk} WHERE {where}"
    gpus: dict[int, Gpu] = {}
    for row in rawsql.fetch_all(sql, params):
        gpu = gpu_cols.load(row)
        gpu.model = model_cols.load(row, gpu_cols.width)  # cached on the instance, as select_related does
        gpus[gpu.pk] = gpu
    nodes: dict[int, Node] = {}
    if node_ids:
        where, params = rawsql.in_clause("n.id", node_ids)
        sql = f"SELECT {node_cols.sql} FROM {quote(Node._meta.db_table)} n WHERE {where}"  # noqa: S608
        nodes = {n.pk: n for n in (node_cols.load(row) for row in rawsql.fetch_all(sql, params))}
    return gpus, nodes


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
    result.ms = (time.perf_counter() - t0) * 1000
    sql = (
        f"UPDATE {SchedulerState._meta.db_table} SET last_pass_at = %s, last_pass_ms = %s, "  # noqa: S608
        "last_started = %s, pending = %s, passes = passes + 1 WHERE id = 1 AND fence = %s"
    )
    pending = max(0, result.pending - len(result.started))
    rawsql.execute(sql, [rawsql.datetime_param(now), result.ms, len(result.started), pending, token])
    return result


# --- The loop ------------------------------------------------------------------------------------------------


BOUNDARY_CHECK_S = 0.5  # how often the leader looks for reservations whose start or end has come


class SchedulerLoop:
    """Wait to lead; while leading, pass every `interval` seconds and whenever woken."""

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        interval: float = conf.SCHEDULER_INTERVAL_S,
        leadership: Leadership | None = None,
        redis: Any = None,
        name: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        from apps.core.redis import get_redis

        self.policy = policy or policy_by_name(conf.SCHEDULER_POLICY)
        self.interval = interval
        self.redis = redis or get_redis()
        self.leadership = leadership or default_leadership()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.log = log or logger.info
        self.stopping = False
        self.leading = False
        self.usage = UsageCache()
        self.last_sweep = 0.0
        self.last_boundary_check = 0.0
        self.batch_s = WAKE_BATCH_S
        self.last_pass_started = 0.0

    def stop(self) -> None:
        self.stopping = True

    def wait(self, timeout: float) -> None:
        """Sleep until woken by a service (BLPOP on the wake list) or `timeout` passes."""
        if timeout <= 0:
            return
        try:
            if self.redis.blpop([WAKE_KEY], timeout=max(0.01, timeout)):
                # Woken: gather what else arrives in the next few milliseconds, so a burst of submissions costs
                # one pass (snapshot + apply) instead of one per job; then one pass answers them all. Passes
                # start at most every SCHEDULER_MIN_PASS_GAP_S: under a steady stream of submissions and exits (tens a
                # second) a pass per wake-up cost the database more than the jobs did, and a pass that comes a
                # little later starts more jobs at once (one batch).
                since = time.monotonic() - self.last_pass_started
                time.sleep(min(max(self.batch_s, conf.SCHEDULER_MIN_PASS_GAP_S - since), max(0.0, timeout)))
                self.redis.delete(WAKE_KEY)
        except Exception as exc:
            logger.warning("scheduler wake list: %s", exc)
            time.sleep(min(timeout, 1.0))

    def step(self) -> PassResult | None:
        """One iteration: make sure we lead, then pass. Returns the pass's result (None when not leading)."""
        close_old_connections()
        self.last_pass_started = time.monotonic()
        if not self.leading:
            if not self.leadership.acquire():
                return None
            self.leading = True
            self.usage = UsageCache()
            self.log(f"scheduler {self.name}: leading (token {self.leadership.token}, policy {self.policy.name})")
        elif not self.leadership.still_leader():
            self.leading = False
            self.log(f"scheduler {self.name}: lost the leadership")
            return None
        try:
            if time.monotonic() - self.last_sweep > SWEEP_EVERY_S:
                services.jobs_sweep()
                self.last_sweep = time.monotonic()
            self.reservation_boundaries()
            result = run_pass(token=self.leadership.token, leader=self.name, policy=self.policy, usage=self.usage)
        except NotLeader as exc:
            self.log(f"scheduler {self.name}: stepping down: {exc}")
            self.leadership.release()
            self.leading = False
            return None
        if result.started or result.stopped:
            logger.info(
                "pass: started %s, stopped %s, %d pending, %.1f ms",
                result.started,
                result.stopped,
                result.pending - len(result.started),
                result.ms,
            )
        return result

    def reservation_boundaries(self) -> None:
        """Activate and release reservations at their start and end, not up to the beat's 15 s tick later: the
        agents learn their holds, the team's jobs get the GPUs and the ended-hook runs on time. The tick stays as
        the backstop (a scheduler that is down); each move is a conditional update, so both running is harmless."""
        from apps.booking.selectors import reservations_due
        from apps.booking.services import reservations_tick

        if time.monotonic() - self.last_boundary_check < BOUNDARY_CHECK_S:
            return  # a burst of wake-ups: one look per BOUNDARY_CHECK_S is on time enough
        self.last_boundary_check = time.monotonic()
        try:
            now = timezone.now()
            if reservations_due(now=now):
                moved = reservations_tick(now=now)
                if moved["activated"] or moved["released"]:
                    logger.info("reservations: activated %s, released %s", moved["activated"], moved["released"])
        except Exception:  # booking's trouble must not stop job scheduling
            logger.exception("moving reservations at their boundaries failed")

    def run(self) -> None:
        self.log(f"scheduler {self.name}: waiting for the leadership")
        try:
            while not self.stopping:
                t0 = time.monotonic()
                try:
                    self.step()
                except Exception:
                    logger.exception("scheduler pass failed")
                    close_old_connections()
                remaining = self.interval - (time.monotonic() - t0)
                if self.leading:
                    self.wait(remaining)
                elif remaining > 0:
                    time.sleep(remaining)
        finally:
            self.leadership.release()
            self.log(f"scheduler {self.name}: stopped")
