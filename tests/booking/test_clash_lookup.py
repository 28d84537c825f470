"""The booking's lookups and write find clashes by reading only the allocations that end inside the window and the first
one ending after it (active allocations of a GPU never overlap). Checked against the plain definition (active and
start < end and end > start) over random calendars: the GPU lookup's conflict report (earliest first, capped) and
the write's own check, which must refuse exactly when something clashes; and placement's pool of a model against
the ORM's bookable, busy and maintenance-blocked GPUs."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from apps.booking import quota, selectors
from apps.booking.models import Allocation, AllocationKind, MaintenanceWindow, Reservation
from apps.booking.services import booking_write, quotas
from apps.booking.services.allocations import allocation_rows
from apps.booking.services.conflicts import MAX_CONFLICTS_SHOWN
from apps.booking.services.gpus import gpus_by_uuid, placement_pool
from apps.fleet.models import GpuStatus, NodeStatus
from tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db(transaction=True)

QUARTER = timedelta(minutes=15)


def _calendar(rng: random.Random, gpu: Any, team: Any, user: Any, origin: datetime) -> list[Allocation]:
    """Active allocations that never overlap (gaps, touching ends, short and long ones) and inactive ones that
    overlap anything, over six days."""
    rows: list[Allocation] = []
    moment = origin
    while moment < origin + timedelta(days=6):
        moment += QUARTER * rng.choice([0, 0, 0, 1, 3, 8])
        length = QUARTER * rng.choice([1, 1, 2, 2, 4, 8, 40])
        reservation = Reservation.objects.create(
            team=team, user=user, gpu_count=1, start=moment, end=moment + length, booked_end=moment + length
        )
        rows.append(
            Allocation(
                gpu=gpu,
                team=team,
                user=user,
                kind=AllocationKind.RESERVATION,
                reservation=reservation,
                start=moment,
                end=moment + length,
                active=True,
            )
        )
        if rng.random() < 0.3:  # a cancelled one lying across it
            rows.append(
                Allocation(
                    gpu=gpu,
                    team=team,
                    kind=AllocationKind.JOB,
                    start=moment - QUARTER * 2,
                    end=moment + length + QUARTER * 2,
                    active=False,
                )
            )
        moment += length
    return Allocation.objects.bulk_create(rows)


def _months(start: datetime, end: datetime) -> list[date]:
    return sorted({date(m.year, m.month, 1) for m in (timezone.localtime(start), timezone.localtime(end - QUARTER))})


def test_clashes_equal_the_plain_definition(fleet: dict[str, Any], vision: Any, alice: Any) -> None:
    rng = random.Random(7)
    gpu = fleet["gpus"]["big/0"]
    origin = timezone.now().replace(second=0, microsecond=0) + timedelta(days=2)
    origin -= timedelta(minutes=origin.minute % 15)
    allocations = _calendar(rng, gpu, vision, alice, origin)
    active = sorted((a for a in allocations if a.active), key=lambda a: a.start)
    assert len(active) > 60  # more than a report shows, so the cap is exercised too
    cases = [(origin - timedelta(hours=2), origin + timedelta(days=7))]  # the whole calendar: capped report
    for _ in range(250):
        start = origin + QUARTER * rng.randint(-8, 6 * 96 + 8)
        cases.append((start, start + QUARTER * rng.choice([1, 2, 3, 8, 30, 200])))
    refused = 0
    for start, end in cases:
        expected = [a for a in active if a.start < end and a.end > start][:MAX_CONFLICTS_SHOWN]
        info = gpus_by_uuid([gpu.uuid], start, end)[gpu.uuid]
        assert [(c.start, c.end, c.reservation_id) for c in info.clashes or ()] == [
            (a.start, a.end, a.reservation_id) for a in expected
        ], (start, end)
        assert info.busy == bool(expected)

        # The write's check, under the same locks as a booking, rolled back after.
        with transaction.atomic():
            months = _months(start, end)
            locked = quotas.lock_usage(vision.pk, months, [gpu.pk], reserve_reservation_id=True)
            reservation = Reservation(
                pk=locked.reservation_id, team=vision, user=alice, gpu_count=1, start=start, end=end, booked_end=end
            )
            rows = booking_write.BookingRows(
                reservation=reservation,
                allocations=allocation_rows(
                    gpu_ids=[gpu.pk], team_id=vision.pk, user=alice, start=start, end=end,
                    kind=AllocationKind.RESERVATION, reservation_id=reservation.pk,
                ),
                hold=quotas.hold_row(
                    team_id=vision.pk, kind=AllocationKind.RESERVATION, reservation_id=reservation.pk, gpu_count=1,
                    hourly_rate=Decimal("1"), start=start, end=end,
                ),
            )  # fmt: skip
            amounts = {m: quota.Amount(Decimal("0"), Decimal("0")) for m in months}
            written = booking_write.booking_write(rows, usage=locked.usage, amounts=amounts)
            assert written != bool(expected), (start, end)
            refused += not written
            transaction.set_rollback(True)
    assert 20 < refused < len(cases) - 20  # both answers were exercised


def test_placement_pool_equals_the_orm_definition(fleet: dict[str, Any], vision: Any, alice: Any, a100: Any) -> None:
    """placement_pool (placement's input) against selectors' bookable, busy and
    maintenance-blocked GPUs, over random calendars on several GPUs, maintenance windows of a GPU, of a node and of
    everything, a degraded GPU, an offline one and an offline node (with and without include_offline)."""
    rng = random.Random(11)
    gpus = fleet["gpus"]
    origin = timezone.now().replace(second=0, microsecond=0) + timedelta(days=2)
    origin -= timedelta(minutes=origin.minute % 15)
    for name in ("big/0", "big/3", "small/1"):
        _calendar(rng, gpus[name], vision, alice, origin)
    gpus["big/5"].status = GpuStatus.DEGRADED
    gpus["big/5"].save(update_fields=["status"])
    gpus["small/2"].status = GpuStatus.OFFLINE
    gpus["small/2"].save(update_fields=["status"])
    down = NodeFactory(name="down", status=NodeStatus.OFFLINE)  # its GPUs report ok: only include_offline books them
    for i in range(2):
        GpuFactory(node=down, index=i, model=a100, uuid=f"GPU-down-{i}")
    MaintenanceWindow.objects.create(
        gpu=gpus["big/6"], start=origin + timedelta(hours=5), end=origin + timedelta(hours=9)
    )
    MaintenanceWindow.objects.create(
        node=fleet["nodes"]["small"], start=origin + timedelta(days=1), end=origin + timedelta(days=1, hours=3)
    )
    MaintenanceWindow.objects.create(start=origin + timedelta(days=4), end=origin + timedelta(days=4, hours=1))
    for _ in range(150):
        start = origin + QUARTER * rng.randint(-8, 6 * 96 + 8)
        end = start + QUARTER * rng.choice([1, 4, 12, 100])
        for include_offline in (False, True):
            ordered = list(
                selectors.bookable_gpus(model=a100, include_offline=include_offline).order_by("node__name", "index")
            )
            ids = [g.pk for g in ordered]
            # The ORM's definition of held: an active allocation at some instant of [start, end).
            held = Allocation.objects.active().overlapping(start, end).filter(gpu_id__in=ids)
            taken = set(held.values_list("gpu_id", flat=True))
            taken |= selectors.maintenance_blocked_gpu_ids(start=start, end=end, gpu_ids=ids)
            expected = [(g.pk, g.uuid, g.node.name, g.pk in taken) for g in ordered]
            pool = placement_pool(a100.pk, start, end, include_offline=include_offline)
            assert [(g.id, g.uuid, g.node, t) for g, t in pool] == expected, (start, end, include_offline)
