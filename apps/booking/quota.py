"""Quota arithmetic: plain functions of plain data (no ORM), so every rule is tested without a database.

Months are calendar months in the installation's time zone; a booking across a month boundary counts in each
month for the time it spends there. Hours are real elapsed hours, so a night across a DST change counts 23 or 25
hours, as the GPUs really are held. GPU-hours and money are `Decimal`, rounded half-up to 4 places.

GPUs are counted as what they are of a physical GPU: a whole GPU is 1, a part (a MIG instance or a share) its
fraction, the same fraction billing charges (`Gpu.capacity`). So a quarter of a GPU for 4 hours is 1 GPU-hour, and
four quarters held at once are 1 GPU against `max_concurrent_gpus`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, tzinfo
from decimal import ROUND_HALF_UP, Decimal

PLACES = Decimal("0.0001")
# GPUs a hold counts are stored with 6 places, as a part's fraction of its GPU is (`Gpu.capacity`: 1g = 0.142857).
GPU_PLACES = Decimal("0.000001")
ZERO = Decimal("0")


def q4(value: Decimal) -> Decimal:
    """Round to the 4 places GPU-hours and money are stored with."""
    return value.quantize(PLACES, rounding=ROUND_HALF_UP)


def held_gpus(value: Decimal | int) -> Decimal:
    """GPUs as a hold stores and counts them (6 places)."""
    return Decimal(value).quantize(GPU_PLACES, rounding=ROUND_HALF_UP)


def gpu_number(value: Decimal | int) -> int | float:
    """A count of GPUs for an API or a page: a whole number stays an int (2), a fraction reads as a short number
    (0.75, not "0.7500"), at the 4 places quota counts GPUs with."""
    rounded = q4(Decimal(value))
    if rounded == rounded.to_integral_value():
        return int(rounded)
    return float(rounded)


def month_of(moment: datetime, tz: tzinfo) -> date:
    """The first day of the month `moment` falls in, in time zone `tz`."""
    local = moment.astimezone(tz)
    return date(local.year, local.month, 1)


def next_month(month: date) -> date:
    return date(month.year + (month.month == 12), month.month % 12 + 1, 1)


def month_bounds(month: date, tz: tzinfo) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of `month` in `tz`, as aware UTC datetimes."""
    first = datetime.combine(month, time(0), tzinfo=tz).astimezone(UTC)
    after = datetime.combine(next_month(month), time(0), tzinfo=tz).astimezone(UTC)
    return first, after


def split_by_month(start: datetime, end: datetime, tz: tzinfo) -> list[tuple[date, Decimal]]:
    """[(month, seconds)] that [start, end) spends in each calendar month of `tz`, in month order."""
    if end <= start:
        return []
    # In UTC: subtracting two datetimes that share a tzinfo gives wall-clock time, wrong across a DST change.
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    out: list[tuple[date, Decimal]] = []
    month = month_of(start, tz)
    while True:
        first, after = month_bounds(month, tz)
        lo, hi = max(start, first), min(end, after)
        if hi > lo:
            out.append((month, Decimal(str((hi - lo).total_seconds()))))
        if end <= after:
            return out
        month = next_month(month)


@dataclass(frozen=True)
class Amount:
    """GPU-hours and money counted against a quota."""

    gpu_hours: Decimal = ZERO
    cost: Decimal = ZERO

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpu_hours + other.gpu_hours, self.cost + other.cost)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.gpu_hours - other.gpu_hours, self.cost - other.cost)

    def __neg__(self) -> Amount:
        return Amount(-self.gpu_hours, -self.cost)


def hold_amounts(
    *, start: datetime, end: datetime, gpu_count: Decimal | int, hourly_rate: Decimal, tz: tzinfo
) -> dict[date, Amount]:
    """What holding `gpu_count` GPUs over [start, end) counts in each month; `hourly_rate` is for all of them.
    `gpu_count` is in GPUs, fractions included: a quarter of a GPU is Decimal("0.25")."""
    out: dict[date, Amount] = {}
    gpus = Decimal(gpu_count)
    for month, seconds in split_by_month(start, end, tz):
        hours = seconds / Decimal(3600)
        out[month] = Amount(gpu_hours=q4(hours * gpus), cost=q4(hours * hourly_rate))
    return out


def amounts_delta(before: Mapping[date, Amount], after: Mapping[date, Amount]) -> dict[date, Amount]:
    """Per month, what changes when a hold goes from `before` to `after` (months without change omitted)."""
    out: dict[date, Amount] = {}
    for month in sorted(set(before) | set(after)):
        delta = after.get(month, Amount()) - before.get(month, Amount())
        if delta.gpu_hours or delta.cost:
            out[month] = delta
    return out


def peak_concurrency(
    intervals: Iterable[tuple[datetime, datetime, Decimal | int]], start: datetime, end: datetime
) -> Decimal:
    """The most GPUs held at any instant of [start, end) by the given (start, end, gpus) intervals; `gpus` may be
    a fraction (a part of a GPU). Rounded to 4 places, as quotas count GPUs (a part's fraction has 6 places: 1g
    is 0.142857, so seven of them make 0.999999)."""
    events: list[tuple[datetime, Decimal]] = []
    for lo, hi, n in intervals:
        lo, hi = max(lo, start), min(hi, end)
        if hi > lo:
            events.append((lo, Decimal(n)))
            events.append((hi, -Decimal(n)))
    # Ends sort before starts at the same instant: [a, b) and [b, c) never overlap.
    events.sort(key=lambda e: (e[0], e[1]))
    peak = current = ZERO
    for _, n in events:
        current += n
        peak = max(peak, current)
    return q4(peak)


@dataclass(frozen=True)
class Limits:
    """One month's quota; None = unlimited. `allowed_model_ids` None or empty = every model."""

    gpu_hours: Decimal | None = None
    max_concurrent_gpus: int | None = None
    budget_soft: Decimal | None = None
    budget_hard: Decimal | None = None
    allowed_model_ids: frozenset[int] | None = None

    def allows_model(self, model_id: int | None) -> bool:
        if not self.allowed_model_ids:
            return True
        return model_id is not None and model_id in self.allowed_model_ids


@dataclass(frozen=True)
class Verdict:
    """The answer of `evaluate`: refused (with what was exceeded) or allowed (with soft warnings)."""

    ok: bool
    exceeded: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    remaining: dict[str, Decimal | int | None] = field(default_factory=dict)


def remaining_out(left: Mapping[str, Decimal | int | None]) -> dict[str, str | int | float | None]:
    """What is left, as the API shows it: GPU-hours and money as 4-place strings, concurrent GPUs as a number
    (1, or 0.75 while parts of GPUs are held)."""
    out: dict[str, str | int | float | None] = {}
    for key, value in left.items():
        if value is None or isinstance(value, int):
            out[key] = value
        elif key == "concurrent_gpus":
            out[key] = gpu_number(value)
        else:
            out[key] = str(q4(value))
    return out


def remaining(limits: Limits, used: Amount, peak: Decimal | int | None = None) -> dict[str, Decimal | int | None]:
    """What is left of each limit (None = unlimited), before the booking being checked."""
    return {
        "gpu_hours": None if limits.gpu_hours is None else q4(limits.gpu_hours - used.gpu_hours),
        "budget": None if limits.budget_hard is None else q4(limits.budget_hard - used.cost),
        "budget_soft": None if limits.budget_soft is None else q4(limits.budget_soft - used.cost),
        "concurrent_gpus": (
            None
            if limits.max_concurrent_gpus is None or peak is None
            else q4(limits.max_concurrent_gpus - Decimal(peak))
        ),
    }


def evaluate(
    *, limits: Limits, used: Amount, add: Amount, peak: Decimal | int | None = None, add_gpus: Decimal | int = 0
) -> Verdict:
    """Whether `add` fits one month's quota given what is `used`; `peak` = the team's most GPUs held at once
    during the new booking's window without it (None: not checked); `add_gpus` = the GPUs the booking holds
    (fractions of parts summed)."""
    exceeded: list[str] = []
    warnings: list[str] = []
    total = used + add
    if limits.gpu_hours is not None and add.gpu_hours > 0 and total.gpu_hours > limits.gpu_hours:
        exceeded.append("gpu_hours")
    if limits.budget_hard is not None and add.cost > 0 and total.cost > limits.budget_hard:
        exceeded.append("budget")
    if (
        limits.max_concurrent_gpus is not None
        and peak is not None
        and add_gpus > 0
        and q4(Decimal(peak) + Decimal(add_gpus)) > limits.max_concurrent_gpus
    ):
        exceeded.append("concurrent_gpus")
    if limits.budget_soft is not None and add.cost > 0 and total.cost > limits.budget_soft:
        warnings.append("budget_soft")
    return Verdict(
        ok=not exceeded, exceeded=tuple(exceeded), warnings=tuple(warnings), remaining=remaining(limits, used, peak)
    )
