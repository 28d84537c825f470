"""Cost arithmetic: plain functions of plain data (no Django import), tested without a database.

The rules, in one place:
- Billing is by the second: an interval's ends are truncated to the whole second (UTC) before anything else, so
  [10:00:00.7, 10:17:23.4) bills 1043 s. Sums over adjacent pieces equal the whole, exactly.
- An interval is split at every local midnight of the installation's time zone (so at every month boundary too,
  and a DST day is 23 or 25 hours long, as the GPU is really held) and at every price change of its GPU model.
  Each piece has one price and lies in one day and one month: one ledger row per piece and GPU.
- Cost = seconds x hourly price / 3600, `Decimal`, kept to COST_PLACES (far below a cent); rounding to the cent
  happens only when a figure is shown (`to_cents`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

SECONDS_PER_HOUR = Decimal(3600)
COST_PLACES = Decimal("1e-8")
CENT = Decimal("0.01")
ZERO = Decimal(0)


@dataclass(frozen=True, order=True)
class PricePoint:
    """`hourly_price` applies from `valid_from` (aware) until the next point of the same model."""

    valid_from: datetime
    hourly_price: Decimal


@dataclass(frozen=True)
class Piece:
    """A part of a billed interval with one price, inside one local day (and so one month)."""

    start: datetime
    end: datetime
    seconds: int
    hourly_price: Decimal
    cost: Decimal
    day: date  # local date the piece lies in
    month: date  # first day of that local month


# --- Time ---------------------------------------------------------------------------------------------------


def truncate_to_second(moment: datetime) -> datetime:
    """The whole second `moment` falls in, as aware UTC (naive datetimes are refused: they are bugs)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: billing needs aware datetimes")
    return moment.astimezone(UTC).replace(microsecond=0)


def local_midnight(day: date, tz: tzinfo) -> datetime:
    """The first instant of local `day` in `tz`, as aware UTC."""
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)


def month_of(moment: datetime, tz: tzinfo) -> date:
    """First day of the local month `moment` falls in."""
    local = moment.astimezone(tz)
    return date(local.year, local.month, 1)


def next_month(month: date) -> date:
    return date(month.year + (month.month == 12), month.month % 12 + 1, 1)


def previous_month(month: date) -> date:
    return date(month.year - (month.month == 1), (month.month - 2) % 12 + 1, 1)


def month_bounds(month: date, tz: tzinfo) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of the local `month`, as aware UTC."""
    return local_midnight(month.replace(day=1), tz), local_midnight(next_month(month), tz)


def day_bounds(day: date, tz: tzinfo) -> tuple[datetime, datetime]:
    return local_midnight(day, tz), local_midnight(day + timedelta(days=1), tz)


def days_of_month(month: date) -> list[date]:
    first = month.replace(day=1)
    return [first + timedelta(days=i) for i in range((next_month(first) - first).days)]


def midnights_between(start: datetime, end: datetime, tz: tzinfo) -> Iterator[datetime]:
    """Local midnights strictly inside (start, end), in order."""
    day = start.astimezone(tz).date() + timedelta(days=1)
    while True:
        midnight = local_midnight(day, tz)
        if midnight >= end:
            return
        if midnight > start:
            yield midnight
        day += timedelta(days=1)


# --- Prices -------------------------------------------------------------------------------------------------


def normalize_prices(points: Sequence[PricePoint]) -> list[PricePoint]:
    """Sorted by `valid_from` (truncated to the second); the later-listed point wins a tie."""
    by_start: dict[datetime, Decimal] = {}
    for point in points:
        by_start[truncate_to_second(point.valid_from)] = Decimal(point.hourly_price)
    return [PricePoint(at, price) for at, price in sorted(by_start.items())]


def price_at(points: Sequence[PricePoint], moment: datetime, fallback: Decimal | None = None) -> Decimal | None:
    """The price in force at `moment`: the last point with valid_from <= moment; before the first, `fallback`.
    `points` must be normalized (sorted)."""
    starts = [p.valid_from for p in points]
    i = bisect.bisect_right(starts, moment)
    return points[i - 1].hourly_price if i else fallback


# --- Money --------------------------------------------------------------------------------------------------


def cost_of(seconds: int | Decimal, hourly_price: Decimal) -> Decimal:
    """seconds x hourly price / 3600, kept to COST_PLACES (banker's rounding, so errors do not drift)."""
    return (Decimal(seconds) * Decimal(hourly_price) / SECONDS_PER_HOUR).quantize(COST_PLACES, ROUND_HALF_EVEN)


def to_cents(amount: Decimal) -> Decimal:
    """Presentation rounding: half up to the cent."""
    return Decimal(amount).quantize(CENT, ROUND_HALF_UP)


def idle_cost(cost: Decimal, mean_utilization: Decimal | None) -> Decimal | None:
    """The share of `cost` the GPU spent idle: cost x (1 - utilization); unknown without telemetry."""
    if mean_utilization is None:
        return None
    return (Decimal(cost) * (1 - Decimal(mean_utilization))).quantize(COST_PLACES, ROUND_HALF_EVEN)


# --- Splitting ----------------------------------------------------------------------------------------------


def split(
    start: datetime,
    end: datetime,
    *,
    prices: Sequence[PricePoint],
    tz: tzinfo,
    fallback_price: Decimal = ZERO,
) -> list[Piece]:
    """Cut [start, end) at local midnights and at price changes; one priced `Piece` per part, in order.

    `prices` are the GPU model's price points (normalized or not); before the first point `fallback_price`
    applies. Empty when the interval is shorter than a second.
    """
    lo, hi = truncate_to_second(start), truncate_to_second(end)
    if hi <= lo:
        return []
    points = normalize_prices(prices)
    cuts = set(midnights_between(lo, hi, tz))
    cuts.update(p.valid_from for p in points if lo < p.valid_from < hi)
    edges = [lo, *sorted(cuts), hi]
    pieces: list[Piece] = []
    for a, b in itertools.pairwise(edges):
        price = price_at(points, a, fallback_price)
        assert price is not None
        seconds = int((b - a).total_seconds())
        local_day = a.astimezone(tz).date()
        pieces.append(
            Piece(
                start=a,
                end=b,
                seconds=seconds,
                hourly_price=price,
                cost=cost_of(seconds, price),
                day=local_day,
                month=local_day.replace(day=1),
            )
        )
    return pieces


def interval_cost(
    start: datetime,
    end: datetime,
    *,
    prices: Sequence[PricePoint],
    tz: tzinfo,
    fallback_price: Decimal = ZERO,
    gpu_count: int = 1,
) -> Decimal:
    """What holding `gpu_count` GPUs of one model over [start, end) costs: the sum of its pieces."""
    pieces = split(start, end, prices=prices, tz=tz, fallback_price=fallback_price)
    return sum((p.cost for p in pieces), ZERO) * gpu_count


def clip(start: datetime, end: datetime, lo: datetime, hi: datetime) -> tuple[datetime, datetime] | None:
    """[start, end) ∩ [lo, hi), or None when empty."""
    a, b = max(start, lo), min(end, hi)
    return (a, b) if b > a else None


# --- Budget projection ----------------------------------------------------------------------------------------


def project_month_end(
    *, spent: Decimal, month_start: datetime, month_end: datetime, now: datetime, running_hourly: Decimal = ZERO
) -> Decimal:
    """Month-end cost if the month goes on as it went: the average rate so far, or at least what is running now
    (the GPUs held this minute, `running_hourly` per hour), over the rest of the month."""
    if now >= month_end:
        return spent
    elapsed = Decimal(int((max(now, month_start) - month_start).total_seconds()))
    total = Decimal(int((month_end - month_start).total_seconds()))
    remaining = total - elapsed
    at_average = spent * total / elapsed if elapsed > 0 else spent
    at_running = spent + running_hourly * remaining / SECONDS_PER_HOUR
    return max(at_average, at_running).quantize(COST_PLACES, ROUND_HALF_EVEN)
