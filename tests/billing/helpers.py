"""Builders for billing tests: GPUs with a price, allocations as booking writes them, telemetry rollups.

Billing only reads `booking.Allocation`, so tests write the rows directly (as `allocations_create` /
`allocation_end` leave them: active rows cut to their real end; cancelled-before-start rows inactive)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from apps.booking.models import Allocation, AllocationKind, Reservation, ReservationStatus
from apps.fleet.models import Gpu, GpuModel
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

_job_ids = itertools.count(10_000)


def gpu_model(name: str = "A100-80GB", price: str = "2.5000") -> GpuModel:
    model = GpuModelFactory(name=name)
    model.hourly_price = Decimal(price)
    model.save(update_fields=["hourly_price"])
    return model


def gpus(count: int, *, model: GpuModel | None = None, node: str = "billing-node") -> list[Gpu]:
    model = model or gpu_model()
    host = NodeFactory(name=node)
    first = Gpu.objects.filter(node=host).count()
    return [GpuFactory(node=host, index=first + i, model=model, uuid=f"GPU-{node}-{first + i}") for i in range(count)]


def reserve(team: Any, user: Any, gpu_list: list[Gpu], start: datetime, end: datetime) -> list[Allocation]:
    reservation = Reservation.objects.create(
        team=team,
        user=user,
        gpu_model=gpu_list[0].model,
        gpu_count=len(gpu_list),
        start=start,
        end=end,
        booked_end=end,
        status=ReservationStatus.ACTIVE,
    )
    return [
        Allocation.objects.create(
            gpu=g, team=team, user=user, kind=AllocationKind.RESERVATION, reservation=reservation, start=start, end=end
        )
        for g in gpu_list
    ]


def run_job(team: Any, user: Any, gpu: Gpu, start: datetime, end: datetime, job_id: int | None = None) -> Allocation:
    return Allocation.objects.create(
        gpu=gpu,
        team=team,
        user=user,
        kind=AllocationKind.JOB,
        job_id=job_id or next(_job_ids),
        start=start,
        end=end,
    )


def end_early(allocation: Allocation, at: datetime) -> None:
    """What booking's allocation_end does: cut a started row, deactivate one that had not started."""
    if allocation.start >= at:
        Allocation.objects.filter(pk=allocation.pk).update(active=False, ended_at=at)
    else:
        Allocation.objects.filter(pk=allocation.pk).update(end=at, ended_at=at)
    allocation.refresh_from_db()


def rollups(gpu: Gpu, start: datetime, end: datetime, util: float | None, *, samples: int = 60) -> int:
    """Minute rollups of one GPU over [start, end) at a constant utilization (percent)."""
    from apps.telemetry.models import GpuRollup

    minute = start.replace(second=0, microsecond=0)
    rows = []
    while minute < end:
        rows.append(GpuRollup(gpu=gpu, minute=minute, samples=samples, util_mean=util))
        minute += timedelta(minutes=1)
    GpuRollup.objects.bulk_create(rows)
    return len(rows)
