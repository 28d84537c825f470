"""Reads: pools with their GPUs, the pool a job is routed to, and a bridge's work list."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Q
from django.utils import timezone

from apps.accounts.tokens import digest_of, split
from apps.booking.models import Allocation, AllocationKind, ReservationStatus
from apps.core.errors import ValidationFailed
from apps.fleet.models import Gpu, Pool
from apps.jobs.models import Job, JobState
from apps.pools.backends import BACKENDS
from apps.pools.models import BridgeToken, ExternalJob

AGENTS_POOL = "agents"  # the name nodes without a pool are listed under
MAX_CLAIM = 100  # queued jobs handed to a bridge per poll


def pools_with_gpus() -> list[dict[str, Any]]:
    """Every pool with its live GPUs; nodes without a pool form the `agents` pool."""
    gpus = Gpu.objects.filter(retired_at__isnull=True).select_related("node__pool", "model").order_by("node__name")
    by_pool: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_pool[gpu.node.pool.name if gpu.node.pool else AGENTS_POOL].append(gpu)
    pools: list[dict[str, Any]] = [
        {"name": p.name, "backend": p.backend, "description": p.description} for p in Pool.objects.all()
    ]
    if not any(p["name"] == AGENTS_POOL for p in pools):
        pools.insert(0, {"name": AGENTS_POOL, "backend": "agents", "description": "the portal's own node agents"})
    for pool in pools:
        pool["gpus"] = [
            {"uuid": g.uuid, "node": g.node.name, "index": g.index, "model": g.model.name, "status": g.status}
            for g in by_pool.get(str(pool["name"]), [])
        ]
    return pools


def pool_for_token(plaintext: str) -> Pool | None:
    parts = split(plaintext)
    if parts is None or parts[0] != "gpb":
        return None
    row = BridgeToken.objects.select_related("pool").filter(prefix=parts[1]).first()
    if row is None or row.digest != digest_of(plaintext):
        return None
    return row.pool


def models_only_in(pool: Pool) -> set[str]:
    """GPU models whose live GPUs are all in `pool`: a job asking only for these goes to that pool's scheduler."""
    mine = set(Gpu.objects.filter(node__pool=pool, retired_at__isnull=True).values_list("model__name", flat=True))
    elsewhere = set(
        Gpu.objects.filter(retired_at__isnull=True)
        .exclude(node__pool=pool)
        .filter(model__name__in=mine)
        .values_list("model__name", flat=True)
    )
    return mine - elsewhere


def routed_pool(gpu_models: list[str]) -> Pool | None:
    """The bridged pool that schedules a job asking for `gpu_models`, or None (the portal's scheduler does)."""
    if not gpu_models:
        return None
    pools = set(
        Gpu.objects.filter(retired_at__isnull=True, model__name__in=gpu_models).values_list("node__pool", flat=True)
    )
    if len(pools) != 1 or None in pools:
        return None
    pool = Pool.objects.get(pk=pools.pop())
    backend = BACKENDS.get(pool.backend)
    return pool if backend is not None and backend.bridged else None


def models_for_pool(name: str, wanted: list[str]) -> list[str]:
    """The GPU models a job naming pool `name` may run on: the pool's models (narrowed to `wanted` when given).

    Naming a pool lets that pool's scheduler choose among its GPUs. For a pool another scheduler runs, the models
    must live only there, or the portal could not tell which scheduler the job is for. Raises ValidationFailed.
    """
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        raise _pool_error(f"There is no pool {name!r} (GET /api/v1/pools/ lists them).")
    mine = set(Gpu.objects.filter(node__pool=pool, retired_at__isnull=True).values_list("model__name", flat=True))
    if not mine:
        raise _pool_error(f"Pool {name!r} has no GPUs.")
    if wanted:
        outside = sorted(set(wanted) - mine)
        if outside:
            raise _pool_error(f"Pool {name!r} has no {outside[0]} GPUs.")
        mine &= set(wanted)
    backend = BACKENDS.get(pool.backend)
    if backend is not None and backend.bridged:
        shared = sorted(mine - models_only_in(pool))
        if shared:
            raise _pool_error(
                f"{shared[0]} GPUs are also outside pool {name!r}, so the job could not be sent to it; "
                "name a model that only this pool has."
            )
    return sorted(mine)


def _pool_error(message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={"pool": [message]})


def unclaimed_jobs(pool: Pool) -> list[Job]:
    """Queued jobs whose every acceptable model lives only in this pool, not yet handed to its bridge."""
    models = models_only_in(pool)
    in_reservation = Q(reservation__allocations__gpu__node__pool=pool)
    queued = Job.objects.filter(state=JobState.QUEUED, external__isnull=True).filter(
        Q(reservation__isnull=True) | in_reservation
    )
    picked = []
    for job in queued.select_related("team").distinct().order_by("submitted_at", "id")[: MAX_CLAIM * 5]:
        wanted = set(job.gpu_models or [])
        if job.reservation_id is not None or (wanted and wanted <= models):
            picked.append(job)
        if len(picked) >= MAX_CLAIM:
            break
    return picked


def mirrored_reservations(pool: Pool) -> list[dict[str, Any]]:
    """Booked and active reservations holding GPUs of this pool, with the nodes those GPUs are on: what the bridge
    keeps as reservations in the pool's scheduler (named `portal-res-<id>`)."""
    now = timezone.now()
    rows = (
        Allocation.objects.filter(
            kind=AllocationKind.RESERVATION,
            active=True,
            end__gt=now,  # a booking moved off a device while running keeps its used part there, ended
            gpu__node__pool=pool,
            reservation__status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE],
            reservation__end__gt=now,
        )
        .values_list(
            "reservation_id", "reservation__team__slug", "reservation__start", "reservation__end", "gpu__node__name"
        )
        .order_by("reservation_id")
    )
    out: dict[int, dict[str, Any]] = {}
    for rid, team, start, end, node in rows:
        item = out.setdefault(rid, {"id": rid, "team": team, "start": start.timestamp(), "end": end.timestamp(),
                                    "nodes": [], "gpu_count": 0})  # fmt: skip
        if node not in item["nodes"]:
            item["nodes"].append(node)
        item["gpu_count"] += 1
    return list(out.values())


def followed(pool: Pool) -> list[ExternalJob]:
    return list(ExternalJob.objects.filter(pool=pool, done=False).select_related("job__team").order_by("job_id"))
