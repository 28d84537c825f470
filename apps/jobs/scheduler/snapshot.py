"""A scheduler pass's reads: the snapshot of the fleet, running and queued jobs, reservations and maintenance
windows, and each team's decayed usage, as the pure core's plain data.

The snapshot's queries are hand-written SQL returning plain rows: an idle leader passes every second, and compiling
the ORM queries and building model instances of the whole fleet was most of such a pass. Table names come from the
models' metadata and every value is a parameter. Only the queued jobs are loaded as instances (the apply step
starts them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from apps.accounts.models import Team
from apps.booking.models import Allocation, AllocationKind, MaintenanceWindow, Reservation, ReservationStatus
from apps.core.ttlcache import TTLCache
from apps.fleet.models import DeviceKind, Gpu, GpuModel, GpuStatus, Node, NodeStatus, Pool
from apps.fleet.selectors import released_within
from apps.jobs import conf
from apps.jobs.models import ON_NODE_STATES, Job, JobState, SchedulerState
from apps.jobs.scheduling import Gpu as CoreGpu
from apps.jobs.scheduling import PendingJob as CorePending
from apps.jobs.scheduling import Reservation as CoreReservation
from apps.jobs.scheduling import RunningJob as CoreRunning
from apps.jobs.scheduling import Snapshot
from apps.telemetry import keys
from apps.telemetry.selectors import in_use_outside

MAX_PENDING = 20_000
USAGE_REFRESH_S = 30.0
MAINTENANCE_TEAM = "__maintenance__"
OUTSIDE_REFRESH_S = 10.0
_OUTSIDE = TTLCache[str, dict[str, int]](ttl_s=OUTSIDE_REFRESH_S, maxsize=1)


def epoch(moment: datetime) -> float:
    return moment.timestamp()


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
    shares: int = 1  # N: split in N shares, which a whole-GPU job takes all of (apply step)
    uuid: str = ""


@dataclass
class PassContext:
    """The snapshot plus the rows the apply step needs, keyed by the core's string ids."""

    now: datetime
    snapshot: Snapshot
    gpus: dict[str, GpuRow] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)  # node name -> id
    pending: dict[str, Job] = field(default_factory=dict)
    part_jobs: list[Job] = field(default_factory=list)
    split_shares: dict[str, list[int]] = field(default_factory=dict)  # a split GPU's id -> its shares' ids
    running: dict[str, RunningRow] = field(default_factory=dict)
    reservation_ends: dict[str, datetime] = field(default_factory=dict)
    layout_version: int = 0  # SchedulerState.layout_version as the GPUs were read
    outside: dict[str, int] = field(default_factory=dict)  # free GPUs in use outside the portal -> MiB used


class UsageCache:
    """Decayed GPU-seconds per team, recomputed from job rows at most every USAGE_REFRESH_S (one per leadership:
    a new leader starts from fresh numbers)."""

    def __init__(self, half_life_s: float = conf.FAIRSHARE_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._cache = TTLCache[str, dict[str, float]](ttl_s=USAGE_REFRESH_S, maxsize=1)

    def get(self, now: datetime) -> dict[str, float]:
        hit = self._cache.get("usage")
        if hit:
            return hit
        horizon = now - timedelta(seconds=self.half_life_s * 4)
        usage = team_usage(now=now, horizon=horizon, half_life_s=self.half_life_s)
        self._cache.set("usage", usage)
        return usage


def team_usage(*, now: datetime, horizon: datetime, half_life_s: float) -> dict[str, float]:
    """Decayed GPU-seconds per team of the jobs that ran since `horizon`, summed by PostgreSQL: one row per team
    instead of one per job of the last four half-lives (hundreds of thousands on a busy installation). The same
    integral as the core's `decayed_gpu_seconds`; exponents are floored at -700 (exp underflows to an error in
    PostgreSQL below about -745, and the term is 0 there anyway)."""
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


def _col(model: type[Model], name: str, alias: str = "") -> str:
    """The quoted column of `model.name` from the model's metadata, under a table alias if given."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    column = connection.ops.quote_name(str(field.column))
    return f"{alias}.{column}" if alias else column


@functools.cache
def _snapshot_sql() -> dict[str, str]:
    """The snapshot's queries, written by hand: compiling eight ORM queries was most of an idle pass's CPU (and an
    idle pass runs every second). Table and column names from the models' metadata; every value is a parameter."""
    q = connection.ops.quote_name
    job, job_gpus = q(Job._meta.db_table), q(Job.gpus.through._meta.db_table)
    alloc, resv, window = (q(m._meta.db_table) for m in (Allocation, Reservation, MaintenanceWindow))
    gpu, node, model, team = (q(m._meta.db_table) for m in (Gpu, Node, GpuModel, Team))
    through = Job.gpus.through

    def j(name: str, alias: str = "") -> str:
        return _col(Job, name, alias)

    def a(name: str) -> str:
        return _col(Allocation, name)

    running = ", ".join(
        j(n) for n in ("id", "team", "started_at", "scheduled_at", "max_duration_s", "reservation", "stop_requested_at")
    )
    return {
        "gpus": (
            f"SELECT {_col(Gpu, 'id', 'g')}, {_col(Gpu, 'node', 'g')}, {_col(Node, 'name', 'n')}, "  # noqa: S608
            f"{_col(GpuModel, 'name', 'm')}, {_col(Gpu, 'shares', 'g')}, {_col(Gpu, 'uuid', 'g')}, "
            # The layout version in the same statement as the GPUs, so it is the one they were read under.
            f"(SELECT {_col(SchedulerState, 'layout_version')} FROM {q(SchedulerState._meta.db_table)} "
            f"WHERE {_col(SchedulerState, 'id')} = 1) FROM {gpu} g "
            f"JOIN {node} n ON {_col(Node, 'id', 'n')} = {_col(Gpu, 'node', 'g')} "
            f"JOIN {model} m ON {_col(GpuModel, 'id', 'm')} = {_col(Gpu, 'model', 'g')} "
            f"WHERE {_col(Gpu, 'retired_at', 'g')} IS NULL AND {_col(Gpu, 'status', 'g')} = %s "
            f"AND {_col(Node, 'status', 'n')} = %s AND {_col(Node, 'draining', 'n')} = %s "
            # Whole GPUs only: MIG instances and shares are parts (fleet.Gpu.parent). A GPU in MIG mode is held
            # through its instances only; one split in shares is a whole GPU too, held through all its shares.
            f"AND {_col(Gpu, 'parent', 'g')} IS NULL AND NOT {_col(Gpu, 'mig_mode', 'g')} "
            # A node without a token cannot verify a launch command: nothing is placed there.
            f"AND {_col(Node, 'token_digest', 'n')} <> '' "
            # GPUs of a pool another scheduler runs (Slurm) are its to place (apps/pools/backends.py).
            f"AND ({_col(Node, 'pool', 'n')} IS NULL OR {_col(Node, 'pool', 'n')} IN (SELECT {_col(Pool, 'id')} "
            f"FROM {q(Pool._meta.db_table)} WHERE {_col(Pool, 'backend')} = 'agents')) ORDER BY {_col(Gpu, 'id', 'g')}"
        ),
        "running": f"SELECT {running} FROM {job} WHERE {j('state')} IN (%s, %s) ORDER BY {j('id')}",  # noqa: S608
        "held_by": (
            f"SELECT {_col(through, 'job', 'jg')}, {_col(through, 'gpu', 'jg')} FROM {job_gpus} jg "  # noqa: S608
            f"JOIN {job} j ON {j('id', 'j')} = {_col(through, 'job', 'jg')} WHERE {j('state', 'j')} IN (%s, %s) "
            f"ORDER BY {_col(through, 'gpu', 'jg')}"
        ),
        "held_now": (
            f"SELECT DISTINCT {a('gpu')} FROM {alloc} WHERE {a('active')} = %s AND {a('kind')} = %s "  # noqa: S608
            f"AND {a('start')} <= %s AND {a('end')} > %s"
        ),
        "reservations": (
            f"SELECT {_col(Reservation, 'id')}, {_col(Reservation, 'team')}, {_col(Reservation, 'start')}, "  # noqa: S608
            f"{_col(Reservation, 'end')} FROM {resv} WHERE ({_col(Reservation, 'status')} IN (%s, %s) "
            f"AND {_col(Reservation, 'end')} > %s) OR {_col(Reservation, 'id')} IN (SELECT DISTINCT "
            f"{j('reservation')} FROM {job} WHERE {j('state')} IN (%s, %s) AND {j('reservation')} IS NOT NULL) "
            f"ORDER BY {_col(Reservation, 'id')}"
        ),
        "reservation_gpus": (
            f"SELECT {a('reservation')}, {a('gpu')} FROM {alloc} WHERE {a('kind')} = %s "  # noqa: S608
            f"AND {a('reservation')} = ANY(%s)"
        ),
        "windows": (
            f"SELECT {', '.join(_col(MaintenanceWindow, n) for n in ('id', 'gpu', 'node', 'start', 'end'))} "  # noqa: S608
            f"FROM {window} WHERE {_col(MaintenanceWindow, 'end')} > %s ORDER BY {_col(MaintenanceWindow, 'id')}"
        ),
        "shares": f"SELECT {_col(Team, 'id')}, {_col(Team, 'share')} FROM {team}",  # noqa: S608
        # The live shares of split GPUs, and those of them held now by anything (a job, a reservation).
        "split_shares": (
            f"SELECT {_col(Gpu, 'id')}, {_col(Gpu, 'parent')} FROM {gpu} WHERE {_col(Gpu, 'parent')} = ANY(%s) "  # noqa: S608
            f"AND {_col(Gpu, 'kind')} = %s AND {_col(Gpu, 'retired_at')} IS NULL ORDER BY {_col(Gpu, 'index')}"
        ),
        "split_held": (
            f"SELECT DISTINCT {a('gpu')} FROM {alloc} WHERE {a('gpu')} = ANY(%s) AND {a('active')} = %s "  # noqa: S608
            f"AND {a('start')} <= %s AND {a('end')} > %s"
        ),
    }


def _sql(name: str) -> str:
    return _snapshot_sql()[name]


def _rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


def load_snapshot(now: datetime, usage: UsageCache | None = None) -> PassContext:
    """Read everything one pass needs (a handful of queries, no query per job)."""
    ctx = PassContext(now=now, snapshot=Snapshot(gpus=(), pending=()))
    on_node = sorted(ON_NODE_STATES)
    # The fleet as plain rows: model instances of every GPU with its node and model, on every pass, grew with the
    # fleet; the apply step loads instances of the GPUs it starts jobs on.
    rows = _rows(_sql("gpus"), [GpuStatus.OK, NodeStatus.ONLINE, False])
    gpu_rows = [GpuRow(*row[:6]) for row in rows]
    ctx.layout_version = int(rows[0][6] or 0) if rows else 0
    ctx.gpus = {str(g.id): g for g in gpu_rows}
    ctx.nodes = {g.node: g.node_id for g in gpu_rows}

    # Running jobs as plain rows (every pass reads them all; model instances with their JSON fields and a GPU
    # prefetch were about a quarter of a pass's CPU). A stop, rare, loads its job.
    running_rows = [
        RunningRow(
            id=r[0],
            team_id=r[1],
            started_at=r[2],
            scheduled_at=r[3],
            max_duration_s=r[4],
            reservation_id=r[5],
            stop_requested_at=r[6],
        )
        for r in _rows(_sql("running"), on_node)
    ]
    ctx.running = {str(r.id): r for r in running_rows}
    share_parent, split_held = _split_gpus(ctx, now)
    held_by: dict[int, list[str]] = {}
    for job_id, gpu_id in _rows(_sql("held_by"), on_node):
        # A job on shares holds their GPU, once, as the core sees it: the GPU is busy until the job's end, and a
        # whole-GPU job on all four shares counts as one GPU held (fair share), not four.
        key = share_parent.get(str(gpu_id), str(gpu_id))
        ids = held_by.setdefault(job_id, [])
        if key not in ids:
            ids.append(key)
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
    # A split GPU whose share is held now by anything (a job, a reservation) is not free whole either.
    explained = {int(gid) for r in running for gid in r.gpu_ids}
    explained |= {int(sid) for sid, pid in share_parent.items() if int(pid) in explained}
    held_now = {r[0] for r in _rows(_sql("held_now"), [True, AllocationKind.JOB, now, now])}
    blocked = (held_now - explained) | split_held

    # Reservations: booked/active ones not over yet, and those of running jobs (even released: the core stops
    # their jobs once the reservation's end has passed).
    resv_rows = _rows(_sql("reservations"), [ReservationStatus.BOOKED, ReservationStatus.ACTIVE, now, *on_node])
    resv_gpus: dict[int, set[str]] = {}
    if resv_rows:
        for rid, gid in _rows(_sql("reservation_gpus"), [AllocationKind.RESERVATION, [r[0] for r in resv_rows]]):
            resv_gpus.setdefault(rid, set()).add(str(gid))
    # A reservation of shares of a split GPU reserves that GPU for whole-GPU jobs: one must be done before it.
    for held in resv_gpus.values():
        held.update({share_parent[g] for g in held if g in share_parent})
    reservations = [
        CoreReservation(str(rid), str(team_id), frozenset(resv_gpus.get(rid, ())), epoch(begin), epoch(end))
        for rid, team_id, begin, end in resv_rows
    ]
    ctx.reservation_ends = {str(rid): end for rid, _, _, end in resv_rows}

    # Maintenance windows behave as reservations of nobody: a job must be done before one starts.
    node_gpus: dict[int, list[str]] = {}
    for key, gpu_row in ctx.gpus.items():
        node_gpus.setdefault(gpu_row.node_id, []).append(key)
    for wid, gpu_id, node_id, begin, end in _rows(_sql("windows"), [now]):
        if gpu_id:
            ids = [str(gpu_id)]
        elif node_id:
            ids = node_gpus.get(node_id, [])
        else:
            ids = list(ctx.gpus)
        if ids:
            reservations.append(CoreReservation(f"m{wid}", MAINTENANCE_TEAM, frozenset(ids), epoch(begin), epoch(end)))

    pending_rows = _pending_jobs()
    ctx.pending = {str(j.pk): j for j in pending_rows}
    # Jobs on parts of GPUs are started by scheduler.parts, never on whole GPUs by the core.
    ctx.part_jobs = [j for j in pending_rows if j.on_part()]
    pending_rows = [j for j in pending_rows if not j.on_part()]
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
    left_to_shares = _wanted_by_shares(ctx)
    ctx.outside = _in_use_outside(ctx, running, reservations, blocked, now) if pending else {}
    gpus = tuple(
        CoreGpu(
            id=gid,
            node=g.node,
            model=g.model,
            free=0.0 if g.id in blocked else 1.0,
            split=g.shares > 1,
            in_use_outside=gid in ctx.outside,
        )
        for gid, g in ctx.gpus.items()
        if not (g.shares > 1 and (gid not in ctx.split_shares or left_to_shares(g.model)))
    )
    shares = {str(pk): float(share) for pk, share in _rows(_sql("shares"), [])}
    ctx.snapshot = Snapshot(
        gpus=gpus,
        pending=tuple(pending),
        running=tuple(running),
        reservations=tuple(reservations),
        team_usage=(usage or UsageCache()).get(now) if pending or ctx.part_jobs else {},
        team_shares=shares,
    )
    return ctx


def _in_use_outside(
    ctx: PassContext,
    running: Sequence[CoreRunning],
    reservations: Sequence[CoreReservation],
    blocked: set[int],
    now: datetime,
) -> dict[str, int]:
    """The whole GPUs (core ids, with the MiB used) nothing in the portal holds now (no job, no reservation or
    maintenance window under way) whose memory something else uses (telemetry): the core places jobs on a node's
    other GPUs first. A GPU a reservation holds is left out: what runs there is its holder's own work; so is one
    the portal released less than keys.OUTSIDE_GRACE_S ago: what its sample shows may be the job that just ended there
    (samples are a second apart, this read up to OUTSIDE_REFRESH_S old), the common case of a queue that waits."""
    at = epoch(now)
    held = {gid for r in running for gid in r.gpu_ids}
    held |= {gid for r in reservations if r.start <= at < r.end for gid in r.gpu_ids}
    # Memory in use is read for every schedulable GPU at most every OUTSIDE_REFRESH_S, not on every pass: it
    # changes over minutes, and one read of a 6,212-GPU fleet is ~33 ms (bench/outside_use.py).
    used = _OUTSIDE.get_or_set("", lambda: in_use_outside(g.uuid for g in ctx.gpus.values() if g.uuid))
    found = {
        gid: used[g.uuid] for gid, g in ctx.gpus.items() if g.uuid in used and gid not in held and g.id not in blocked
    }
    if found:  # rare: one small query then, none on the usual pass
        for gid in released_within([int(gid) for gid in found], seconds=keys.OUTSIDE_GRACE_S, now=now):
            found.pop(str(gid), None)
    return found


def _split_gpus(ctx: PassContext, now: datetime) -> tuple[dict[str, str], set[int]]:
    """The shares of the split GPUs in `ctx.gpus`: each share's id mapped to its GPU's, and the GPUs with a share
    held now (by a job or a reservation). `ctx.split_shares` gets each GPU whose live shares are its N (one whose
    layout is being changed waits for the next pass). Two queries, only when some GPU of the fleet is split."""
    split = [g.id for g in ctx.gpus.values() if g.shares > 1]
    if not split:
        return {}, set()
    found: dict[int, list[int]] = {}
    for share_id, parent_id in _rows(_sql("split_shares"), [split, DeviceKind.SHARE]):
        found.setdefault(parent_id, []).append(share_id)
    ctx.split_shares = {str(pid): ids for pid, ids in found.items() if len(ids) == ctx.gpus[str(pid)].shares}
    share_ids = [sid for ids in found.values() for sid in ids]
    parent_of = {sid: pid for pid, ids in found.items() for sid in ids}
    held = {parent_of[share_id] for (share_id,) in _rows(_sql("split_held"), [share_ids, True, now, now])}
    return {str(sid): str(pid) for sid, pid in parent_of.items()}, held


def _wanted_by_shares(ctx: PassContext) -> Callable[[str], bool]:
    """Whether the split GPUs of a model are left to the queued jobs asking for a share this pass: a share job
    of that model (or of any model) waits outside a reservation. Shares are what admins split the GPU for, so
    a whole-GPU job takes a split GPU only when no fractional job wants it."""
    wanted: set[str] = set()
    anything = False
    for job in ctx.part_jobs:
        if job.gpu_share is None or job.reservation_id is not None:
            continue
        if not job.gpu_models:
            anything = True
            break
        wanted.update(job.gpu_models)
    return lambda model: anything or model in wanted


def _pending_jobs() -> list[Job]:
    """Queued jobs in arrival order with their team and user (the apply step books allocations for them), as
    instances: the start transitions work on them."""
    # A job handed to another scheduler's pool (apps/pools: ExternalJob) waits there, not here.
    queued = Job.objects.select_related("team", "user").filter(state=JobState.QUEUED, external__isnull=True)
    return list(queued.order_by("submitted_at", "id")[:MAX_PENDING])
