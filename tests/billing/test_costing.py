"""The pure cost functions (apps/billing/costing.py): no database, no Django."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.billing import costing
from apps.billing.costing import PricePoint

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_cancelled_interval_is_billed_to_the_second():
    start = utc(2026, 11, 3, 10, 0, 0, 700_000)
    end = utc(2026, 11, 3, 10, 17, 23, 400_000)
    [piece] = costing.split(start, end, prices=[], tz=UTC, fallback_price=Decimal("3.6"))
    assert piece.seconds == 17 * 60 + 23
    assert piece.cost == Decimal("1.04300000")  # 1043 s at 3.60/h = 1.043


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="naive"):
        costing.split(datetime(2026, 1, 1), datetime(2026, 1, 2), prices=[], tz=UTC)


def test_shorter_than_a_second_or_reversed_is_empty():
    t = utc(2026, 1, 1, 12)
    assert costing.split(t, t + timedelta(microseconds=999_999), prices=[], tz=UTC) == []
    assert costing.split(t, t - timedelta(hours=1), prices=[], tz=UTC) == []


def test_split_at_local_midnight_and_month_boundary():
    # 22:00 UTC on Oct 31 is 23:00 in Berlin (CET, after the DST change); midnight Berlin = 23:00 UTC.
    start, end = utc(2026, 10, 31, 22), utc(2026, 11, 1, 1)
    pieces = costing.split(start, end, prices=[], tz=BERLIN, fallback_price=Decimal("2"))
    assert [(p.start, p.end, p.seconds, p.month) for p in pieces] == [
        (utc(2026, 10, 31, 22), utc(2026, 10, 31, 23), 3600, date(2026, 10, 1)),
        (utc(2026, 10, 31, 23), utc(2026, 11, 1, 1), 7200, date(2026, 11, 1)),
    ]
    assert sum(p.cost for p in pieces) == Decimal("6")


def test_split_at_price_change_inside_a_day():
    prices = [PricePoint(utc(2026, 1, 1), Decimal("2.00")), PricePoint(utc(2026, 3, 10, 12), Decimal("3.00"))]
    pieces = costing.split(utc(2026, 3, 10, 6), utc(2026, 3, 10, 18), prices=prices, tz=UTC)
    assert [(p.seconds, p.hourly_price, p.cost) for p in pieces] == [
        (6 * 3600, Decimal("2.00"), Decimal("12")),
        (6 * 3600, Decimal("3.00"), Decimal("18")),
    ]


def test_before_the_first_price_the_fallback_applies():
    prices = [PricePoint(utc(2026, 3, 1), Decimal("5"))]
    pieces = costing.split(utc(2026, 2, 28, 23), utc(2026, 3, 1, 1), prices=prices, tz=UTC, fallback_price=Decimal("1"))
    assert [(p.hourly_price, p.cost) for p in pieces] == [(Decimal("1"), Decimal("1")), (Decimal("5"), Decimal("5"))]


def test_price_change_exactly_at_the_start_applies_to_the_whole_piece():
    prices = [PricePoint(utc(2026, 1, 1), Decimal("2")), PricePoint(utc(2026, 2, 1, 9), Decimal("4"))]
    [piece] = costing.split(utc(2026, 2, 1, 9), utc(2026, 2, 1, 10), prices=prices, tz=UTC)
    assert piece.hourly_price == Decimal("4")


def test_a_tie_between_price_points_keeps_the_last_listed():
    at = utc(2026, 1, 1)
    points = costing.normalize_prices([PricePoint(at, Decimal("1")), PricePoint(at, Decimal("2"))])
    assert points == [PricePoint(at, Decimal("2"))]


@pytest.mark.parametrize(
    "tz,month,hours",
    [
        (BERLIN, date(2026, 3, 1), 31 * 24 - 1),  # spring forward: a 23-hour day
        (BERLIN, date(2026, 10, 1), 31 * 24 + 1),  # fall back: a 25-hour day
        (BERLIN, date(2026, 2, 1), 28 * 24),
        (NEW_YORK, date(2026, 3, 1), 31 * 24 - 1),
        (NEW_YORK, date(2026, 11, 1), 30 * 24 + 1),
        (UTC, date(2028, 2, 1), 29 * 24),
    ],
)
def test_a_whole_month_in_dst_zones_bills_the_real_hours(tz, month, hours):
    first, after = costing.month_bounds(month, tz)
    pieces = costing.split(first - timedelta(hours=5), after + timedelta(hours=5), prices=[], tz=tz)
    in_month = [p for p in pieces if p.month == month]
    assert sum(p.seconds for p in in_month) == hours * 3600
    assert len(in_month) == len(costing.days_of_month(month))


def test_the_dst_day_is_one_piece_of_23_hours():
    first, after = costing.day_bounds(date(2026, 3, 29), BERLIN)
    [piece] = costing.split(first, after, prices=[], tz=BERLIN)
    assert piece.seconds == 23 * 3600
    assert piece.day == date(2026, 3, 29)


def test_cost_keeps_sub_cent_precision_and_rounds_to_cents_only_for_display():
    assert costing.cost_of(1, Decimal("2.5")) == Decimal("0.00069444")
    assert costing.cost_of(3600, Decimal("2.5")) == Decimal("2.5")
    assert costing.to_cents(Decimal("0.00069444") * 10) == Decimal("0.01")
    assert costing.to_cents(Decimal("2.345")) == Decimal("2.35")


def test_idle_cost_is_cost_times_one_minus_utilization():
    assert costing.idle_cost(Decimal("10"), Decimal("0.25")) == Decimal("7.5")
    assert costing.idle_cost(Decimal("10"), None) is None


def test_interval_cost_multiplies_by_gpu_count():
    prices = [PricePoint(utc(2026, 1, 1), Decimal("2"))]
    assert costing.interval_cost(utc(2026, 1, 2), utc(2026, 1, 3), prices=prices, tz=UTC, gpu_count=4) == 192


def test_month_helpers():
    assert costing.next_month(date(2026, 12, 1)) == date(2027, 1, 1)
    assert costing.previous_month(date(2026, 1, 1)) == date(2025, 12, 1)
    assert costing.month_of(utc(2026, 10, 31, 23, 30), BERLIN) == date(2026, 11, 1)
    assert costing.clip(utc(2026, 1, 1), utc(2026, 1, 3), utc(2026, 1, 2), utc(2026, 1, 5)) == (
        utc(2026, 1, 2),
        utc(2026, 1, 3),
    )
    assert costing.clip(utc(2026, 1, 1), utc(2026, 1, 2), utc(2026, 1, 2), utc(2026, 1, 5)) is None


def test_projection_uses_the_average_rate_or_what_runs_now():
    first, after = costing.month_bounds(date(2026, 4, 1), UTC)  # 30 days
    now = first + timedelta(days=10)
    assert costing.project_month_end(spent=Decimal("100"), month_start=first, month_end=after, now=now) == 300
    faster = costing.project_month_end(
        spent=Decimal("100"), month_start=first, month_end=after, now=now, running_hourly=Decimal("1")
    )
    assert faster == 100 + 20 * 24
    assert costing.project_month_end(spent=Decimal("7"), month_start=first, month_end=after, now=after) == 7


moments = st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC))


@settings(max_examples=200, deadline=None)
@given(
    a=moments,
    length_s=st.integers(0, 80 * 86400),
    tz=st.sampled_from([UTC, BERLIN, NEW_YORK]),
    changes=st.lists(st.tuples(moments, st.decimals("0", "20", places=4)), max_size=4),
)
def test_pieces_tile_the_interval_and_costs_add_up(a, length_s, tz, changes):
    b = a + timedelta(seconds=length_s, microseconds=123)
    prices = [PricePoint(at, price) for at, price in changes]
    pieces = costing.split(a, b, prices=prices, tz=tz, fallback_price=Decimal("1.5"))
    lo, hi = costing.truncate_to_second(a), costing.truncate_to_second(b)
    assert sum(p.seconds for p in pieces) == int((hi - lo).total_seconds())
    assert all(p.seconds > 0 for p in pieces)
    assert all(x.end == y.start for x, y in itertools.pairwise(pieces))
    normalized = costing.normalize_prices(prices)
    for p in pieces:
        assert p.day == p.start.astimezone(tz).date() == (p.end - timedelta(seconds=1)).astimezone(tz).date()
        assert p.hourly_price == costing.price_at(normalized, p.end - timedelta(seconds=1), Decimal("1.5"))
        assert p.cost == costing.cost_of(p.seconds, p.hourly_price)
