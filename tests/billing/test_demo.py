"""Demo history: fast, idempotent, and what the reports show is the ledger of real allocations."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.billing import costing, demo, selectors
from apps.billing.models import MonthClose, MonthStatus, UsageRecord
from apps.booking.models import Allocation
from apps.fleet.models import Gpu

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_world(_fast_passwords):
    from apps.accounts import demo as accounts_demo
    from apps.booking import demo as booking_demo

    accounts_demo.load()
    booking_demo.load()


def test_demo_history_is_fast_idempotent_and_reconciles(demo_world):
    now = timezone.now()
    t0 = time.monotonic()
    demo.load(now=now)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, elapsed  # a few seconds on a quiet machine; CI shares its cores
    rows, allocations = UsageRecord.objects.count(), Allocation.objects.count()
    assert rows > 300 and Gpu.objects.filter(node__name="local").count() == 8
    demo.load(now=now)
    assert (UsageRecord.objects.count(), Allocation.objects.count()) == (rows, allocations)

    this_month = selectors.current_month(now=now)
    last, before = costing.previous_month(this_month), costing.previous_month(costing.previous_month(this_month))
    assert set(MonthClose.objects.filter(status=MonthStatus.CLOSED).values_list("month", flat=True)) == {last, before}
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.get(username="admin")
    report = selectors.monthly_report(user=admin, month=last)
    assert [t["team"] for t in report["teams"]] == ["nlp", "vision"]
    assert report["status"] == "closed" and report["totals"]["mean_utilization"] is not None
    assert not report["totals"]["idle_cost_complete"]  # some bookings had no telemetry: flagged
    # The ledger of the closed months is exactly the allocations' seconds.
    tz = selectors.local_tz()
    lo, hi = costing.month_bounds(before, tz)[0], costing.month_bounds(last, tz)[1]
    held = sum(
        int((min(a.end, hi) - max(a.start, lo)).total_seconds()) * a.gpu.capacity
        for a in Allocation.objects.filter(active=True, start__lt=hi, end__gt=lo).select_related("gpu")
    )
    billed = sum(UsageRecord.objects.filter(month__in=[before, last]).values_list("gpu_seconds", flat=True))
    assert abs(billed - held) < UsageRecord.objects.filter(month__in=[before, last], share__lt=1).count()  # per row
    # The GPU in MIG mode and the shared GPU were booked by their parts, never whole, and bill by the slice.
    slices = {(s["gpu_model"], s["slice"]) for t in report["teams"] for s in t["by_slice"]}
    assert ("A100-80GB", "1g.10gb") in slices and ("A100-80GB", "1/4 share") in slices, slices
    split = Gpu.objects.filter(node__name="local").exclude(mig_mode=False, shares=1)
    assert not Allocation.objects.filter(gpu__in=split).exists()
    row = UsageRecord.objects.filter(gpu__mig_profile="1g.10gb", month=last).first()
    assert row is not None and row.share == Decimal("0.142857")  # 1/7 of the GPU, at 1/7 of its price
    hours = Decimal((row.end - row.start).total_seconds()) / 3600
    assert abs(row.cost - row.hourly_price * hours * row.share) < Decimal("0.0001")
    # The shares' rows carry their profile's mean utilization (the demo writes it: no process readings in history).
    assert UsageRecord.objects.filter(gpu__kind="share", mean_utilization__isnull=False).exists()
    # The current month accrues live up to now.
    usage = selectors.teams_month_usage(month=this_month, now=now + timedelta(minutes=1))
    assert sum(u.gpu_seconds for u in usage.values()) > 0
