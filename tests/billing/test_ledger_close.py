"""The ledger closer (services.ledger_close): rows per allocation, GPU and piece; idempotent; the reconciliation."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from apps.billing import selectors, services
from apps.billing.models import Price, UsageRecord
from apps.booking.models import Allocation
from tests.billing import helpers

pytestmark = pytest.mark.django_db
BERLIN = ZoneInfo("Europe/Berlin")


def berlin(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN)


@pytest.fixture(autouse=True)
def _berlin(settings):
    settings.TIME_ZONE = "Europe/Berlin"


def test_a_job_cancelled_mid_way_is_billed_to_the_second(vision, bob):
    [gpu] = helpers.gpus(1)
    start = berlin(2026, 10, 5, 9, 0, 0)
    alloc = helpers.run_job(vision, bob, gpu, start, start + timedelta(hours=8))
    helpers.end_early(alloc, start + timedelta(minutes=17, seconds=23, microseconds=400_000))
    assert services.ledger_close(now=berlin(2026, 10, 6)) == 1
    row = UsageRecord.objects.get()
    assert (row.gpu_seconds, row.start, row.end) == (1043, start, start + timedelta(minutes=17, seconds=23))
    assert row.cost == Decimal("0.72430556")  # 1043 s x 2.50/h
    assert (row.source, row.source_id, row.team, row.user, row.gpu_model) == (
        "job",
        alloc.job_id,
        vision,
        bob,
        gpu.model,
    )


def test_a_reservation_cancelled_before_it_started_bills_nothing(vision, bob):
    gpu_list = helpers.gpus(2)
    start = berlin(2026, 10, 5, 9)
    allocs = helpers.reserve(vision, bob, gpu_list, start, start + timedelta(hours=2))
    for a in allocs:
        helpers.end_early(a, start - timedelta(hours=1))
    assert services.ledger_close(now=berlin(2026, 10, 6)) == 0
    assert not UsageRecord.objects.exists()


def test_split_at_the_month_boundary_and_at_a_price_change(vision, bob):
    [gpu] = helpers.gpus(1)
    Price.objects.create(gpu_model=gpu.model, valid_from=datetime(1970, 1, 1, tzinfo=UTC), hourly_price=Decimal("2"))
    Price.objects.create(gpu_model=gpu.model, valid_from=berlin(2026, 10, 1, 0, 30), hourly_price=Decimal("3"))
    [alloc] = helpers.reserve(vision, bob, [gpu], berlin(2026, 9, 30, 22), berlin(2026, 10, 1, 2))
    services.ledger_close(now=berlin(2026, 10, 2))
    rows = list(UsageRecord.objects.order_by("start").values_list("start", "end", "month", "hourly_price", "cost"))
    assert rows == [
        (berlin(2026, 9, 30, 22), berlin(2026, 10, 1), datetime(2026, 9, 1).date(), Decimal("2"), Decimal("4")),
        (berlin(2026, 10, 1), berlin(2026, 10, 1, 0, 30), datetime(2026, 10, 1).date(), Decimal("2"), Decimal("1")),
        (
            berlin(2026, 10, 1, 0, 30),
            berlin(2026, 10, 1, 2),
            datetime(2026, 10, 1).date(),
            Decimal("3"),
            Decimal("4.5"),
        ),
    ]
    assert all(r.allocation_id == alloc.pk for r in UsageRecord.objects.all())


def test_replaying_the_close_writes_no_duplicate(vision, bob):
    gpu_list = helpers.gpus(3)
    helpers.reserve(vision, bob, gpu_list, berlin(2026, 10, 3, 8), berlin(2026, 10, 5, 8))
    now = berlin(2026, 10, 9)
    assert services.ledger_close(now=now) == 9  # 3 GPUs x 3 local days
    assert services.ledger_close(now=now) == 0
    assert UsageRecord.objects.count() == 9


def test_the_unique_key_is_the_guarantee_even_without_the_closers_checks(vision, bob):
    gpu_list = helpers.gpus(2)
    helpers.reserve(vision, bob, gpu_list, berlin(2026, 10, 3, 8), berlin(2026, 10, 3, 9))
    rows = services.ledger_rows_due(now=berlin(2026, 10, 4))
    again = services.ledger_rows_due(now=berlin(2026, 10, 4))
    services.ledger_insert(rows)
    services.ledger_insert(again)  # a second task that computed the same rows before the first committed
    services.ledger_insert(rows + again)
    assert UsageRecord.objects.count() == 2


def test_pieces_younger_than_the_close_lag_wait(vision, bob, settings):
    [gpu] = helpers.gpus(1)
    start = berlin(2026, 10, 5, 9)
    helpers.run_job(vision, bob, gpu, start, start + timedelta(minutes=30))
    assert services.ledger_close(now=start + timedelta(minutes=31)) == 0  # ended 60 s ago, lag is 120 s
    assert services.ledger_close(now=start + timedelta(minutes=33)) == 1


def test_a_running_allocation_gets_its_finished_days_and_accrues_the_rest_live(vision, bob):
    [gpu] = helpers.gpus(1)
    start = berlin(2026, 10, 5, 22)
    [alloc] = helpers.reserve(vision, bob, [gpu], start, berlin(2026, 10, 9))
    now = berlin(2026, 10, 7, 6, 15)
    services.ledger_close(now=now)
    assert list(UsageRecord.objects.values_list("gpu_seconds", flat=True).order_by("start")) == [2 * 3600, 24 * 3600]
    live = selectors.team_month_usage(team_id=vision.pk, now=now)
    assert live.gpu_seconds == (2 + 24 + 6.25) * 3600
    assert live.live_gpu_seconds == 6.25 * 3600
    assert live.running_gpus == 1
    # Live numbers equal the final rows once the allocation ends and is closed.
    helpers.end_early(alloc, now)
    later = now + timedelta(minutes=10)
    before_close = selectors.team_month_usage(team_id=vision.pk, now=later)
    services.ledger_close(now=later)
    after_close = selectors.team_month_usage(team_id=vision.pk, now=later)
    assert before_close.cost == after_close.cost == live.cost
    assert before_close.gpu_seconds == after_close.gpu_seconds
    assert after_close.live_gpu_seconds == 0
    assert selectors.team_month_cost(team_id=vision.pk, now=later) == live.cost


def test_rows_carry_the_gpus_mean_utilization_or_null(vision, bob):
    gpu_a, gpu_b, gpu_c = helpers.gpus(3)
    start = berlin(2026, 10, 5, 9)
    end = start + timedelta(hours=1)
    helpers.rollups(gpu_a, start, start + timedelta(minutes=30), 80.0)
    helpers.rollups(gpu_a, start + timedelta(minutes=30), end, 20.0)
    from apps.telemetry.models import GpuHourlyRollup

    GpuHourlyRollup.objects.create(gpu=gpu_b, hour=start, samples=3600, util_mean=35.5)
    helpers.reserve(vision, bob, [gpu_a, gpu_b, gpu_c], start, end)
    services.ledger_close(now=end + timedelta(hours=1))
    util = dict(UsageRecord.objects.values_list("gpu_id", "mean_utilization"))
    assert util == {gpu_a.pk: Decimal("0.5"), gpu_b.pk: Decimal("0.355"), gpu_c.pk: None}


def test_a_closed_month_gets_no_more_rows(vision, bob):
    [gpu] = helpers.gpus(1)
    from apps.billing.models import MonthClose, MonthStatus

    MonthClose.objects.create(
        month=datetime(2026, 9, 1).date(), status=MonthStatus.CLOSED, closed_at=berlin(2026, 10, 1)
    )
    helpers.reserve(vision, bob, [gpu], berlin(2026, 9, 30, 20), berlin(2026, 10, 1, 4))
    services.ledger_close(now=berlin(2026, 10, 2))
    assert list(UsageRecord.objects.values_list("month", "gpu_seconds")) == [(datetime(2026, 10, 1).date(), 4 * 3600)]


def _generate_month(teams, users, gpu_list, rng: random.Random, lo: datetime, hi: datetime) -> list[Allocation]:
    """Back-to-back bookings and jobs on each GPU with gaps, some ended early, some cancelled before start."""
    allocations = []
    for gpu in gpu_list:
        t = lo + timedelta(seconds=rng.randrange(0, 6 * 3600))
        while t < hi:
            length = timedelta(seconds=rng.randrange(60, 3 * 86400), microseconds=rng.randrange(0, 10**6))
            i = rng.randrange(len(teams))
            if rng.random() < 0.5:
                [alloc] = helpers.reserve(teams[i], users[i], [gpu], t, t + length)
            else:
                alloc = helpers.run_job(teams[i], users[i], gpu, t, t + length)
            fate = rng.random()
            if fate < 0.2:
                helpers.end_early(alloc, t + length * rng.random())
            elif fate < 0.25:
                helpers.end_early(alloc, t - timedelta(minutes=5))
            allocations.append(alloc)
            t = alloc.end + timedelta(seconds=rng.randrange(0, 12 * 3600))
    return allocations


def test_reconciliation_over_a_month_of_generated_activity(vision, nlp, bob, charlie):
    """The ledger's GPU-seconds per GPU equal the allocated seconds computed independently from the allocations,
    and its cost equals the sum over price periods of seconds x price."""
    rng = random.Random(20261)
    model_a = helpers.gpu_model("A100-80GB", "2.5000")
    model_b = helpers.gpu_model("L40S", "1.1000")
    gpu_list = helpers.gpus(4, model=model_a, node="rec-a") + helpers.gpus(3, model=model_b, node="rec-b")
    change = berlin(2026, 10, 14, 10, 30, 15)
    for model, old, new in ((model_a, "2.5", "2.75"), (model_b, "1.1", "0.95")):
        Price.objects.create(gpu_model=model, valid_from=datetime(1970, 1, 1, tzinfo=UTC), hourly_price=Decimal(old))
        Price.objects.create(gpu_model=model, valid_from=change, hourly_price=Decimal(new))
    month_lo, month_hi = berlin(2026, 10, 1), berlin(2026, 11, 1)  # 745 h: the DST change is in this month
    _generate_month([vision, nlp], [bob, charlie], gpu_list, rng, berlin(2026, 9, 27), berlin(2026, 11, 3))
    # Two runs with replays in between, as a beat task would: mid-month, then after the month.
    services.ledger_close(now=berlin(2026, 10, 16, 3))
    services.ledger_close(now=berlin(2026, 10, 16, 3))
    services.ledger_close(now=berlin(2026, 11, 10))

    rows = UsageRecord.objects.filter(month=datetime(2026, 10, 1).date())
    prices = {model_a.pk: (Decimal("2.5"), Decimal("2.75")), model_b.pk: (Decimal("1.1"), Decimal("0.95"))}
    expected_seconds: dict[int, int] = {}
    expected_cost = Decimal(0)
    for a in Allocation.objects.filter(active=True).select_related("gpu"):
        s = max(a.start.replace(microsecond=0), month_lo)
        e = min(a.end.replace(microsecond=0), month_hi)
        if e <= s:
            continue
        expected_seconds[a.gpu_id] = expected_seconds.get(a.gpu_id, 0) + int((e - s).total_seconds())
        before, after = prices[a.gpu.model_id]
        first_part = max(timedelta(0), min(e, change) - s).total_seconds()
        second_part = max(timedelta(0), e - max(s, change)).total_seconds()
        expected_cost += (Decimal(int(first_part)) * before + Decimal(int(second_part)) * after) / 3600
    got_seconds: dict[int, int] = {}
    got_cost = Decimal(0)
    for gpu_id, seconds, cost in rows.values_list("gpu_id", "gpu_seconds", "cost"):
        got_seconds[gpu_id] = got_seconds.get(gpu_id, 0) + seconds
        got_cost += cost
    assert len(expected_seconds) == 7 and rows.count() > 100
    assert got_seconds == expected_seconds
    assert abs(got_cost - expected_cost) < Decimal("0.000001") * rows.count()
    assert got_cost.quantize(Decimal("0.01")) == expected_cost.quantize(Decimal("0.01"))
    # Every row lies in one local day at one price; no allocation is billed for more than it held.
    for row in rows.select_related("allocation"):
        assert row.start.astimezone(BERLIN).date() == (row.end - timedelta(seconds=1)).astimezone(BERLIN).date()
        assert not row.start < change < row.end
        assert row.allocation.start.replace(microsecond=0) <= row.start < row.end <= row.allocation.end
    # And the live month-to-date figure of the month, after the fact, is the ledger's.
    for team in (vision, nlp):
        usage = selectors.team_month_usage(
            team_id=team.pk, month=datetime(2026, 10, 1).date(), now=berlin(2026, 11, 10)
        )
        assert usage.live_gpu_seconds == 0
        assert usage.gpu_seconds == sum(rows.filter(team=team).values_list("gpu_seconds", flat=True))


def test_selectors_for_booking_and_jobs(vision, bob):
    """team_month_costs (budget checks across months) and source_usage (a job's cost so far) agree with the
    ledger plus what accrues live."""
    [gpu] = helpers.gpus(1)
    job = helpers.run_job(vision, bob, gpu, berlin(2026, 9, 30, 20), berlin(2026, 10, 2, 8))
    now = berlin(2026, 10, 1, 12)
    services.ledger_close(now=now)
    costs = selectors.team_month_costs(
        team_id=vision.pk, months=[datetime(2026, 9, 1).date(), datetime(2026, 10, 1).date()], now=now
    )
    assert costs == {datetime(2026, 9, 1).date(): Decimal("10"), datetime(2026, 10, 1).date(): Decimal("30")}
    assert selectors.source_usage(source="job", source_id=job.job_id, now=now) == (16 * 3600, Decimal("40"))
    assert selectors.estimate_cost(
        gpu_model_id=gpu.model_id, start=berlin(2026, 10, 1), end=berlin(2026, 10, 1, 2), gpu_count=3
    ) == Decimal("15")
