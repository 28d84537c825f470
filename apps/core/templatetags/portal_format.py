"""`{% load portal_format %}`: how pages show amounts. The API keeps full precision (4-place GPU-hours, 8-place
ledger costs, floats from JSON); a person reads money in cents and quantities with two decimals, grouped by
thousands, so `0.00559999999999999` and `2000.0000` never reach a page.

    {{ usage.cost|money }}            1,204.60
    {{ usage.cost|money:"EUR" }}      1,204.60 EUR
    {{ quota.gpu_hours|quantity }}    2,000.00
    {{ ratio|percent }}               42%
    {{ seconds|duration }}            1 h 02 min
    {{ job.command|argv }}            python -c 'import os; print(1)'
"""

from __future__ import annotations

import shlex
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template

register = template.Library()

CENTS = Decimal("0.01")
DASH = "—"


def as_decimal(value: object) -> Decimal | None:
    """A Decimal from what selectors hand pages (Decimal, str, int, float); None for empty or not a number."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value))
    except (InvalidOperation, ValueError, TypeError):
        return None
    return number if number.is_finite() else None


def two_places(value: object) -> str:
    """`value` rounded half-up to two places, thousands grouped with commas; a dash when there is no number."""
    number = as_decimal(value)
    if number is None:
        return DASH
    rounded = number.quantize(CENTS, rounding=ROUND_HALF_UP)
    if rounded == 0:
        rounded = abs(rounded)  # no "-0.00" for a tiny negative
    return f"{rounded:,.2f}"


@register.filter
def money(value: object, currency: str = "") -> str:
    """An amount of money in cents, with the currency code after it when one is given."""
    text = two_places(value)
    return f"{text} {currency}" if currency and text != DASH else text


@register.filter
def quantity(value: object) -> str:
    """GPU-hours and other measured quantities: two decimals, grouped by thousands."""
    return two_places(value)


@register.filter
def percent(value: object) -> str:
    """A 0..1 ratio as a whole percentage."""
    number = as_decimal(value)
    if number is None:
        return DASH
    return f"{(number * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)}%"


def duration_text(seconds: object) -> str:
    """Seconds as a person reads a run time: `45 s`, `3 min 05 s`, `4 h 00 min` (days count in hours)."""
    number = as_decimal(seconds)
    if number is None or number < 0:
        return DASH
    total = int(number.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours:,} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


@register.filter
def duration(seconds: object) -> str:
    """A number of seconds as hours, minutes and seconds."""
    return duration_text(seconds)


@register.filter
def argv(value: object) -> str:
    """A command's argv list as a shell would need it typed: joined with spaces, each argument quoted where it has
    to be, so `["python", "-c", "import os; print(1)"]` does not read as five arguments and can be pasted."""
    if not isinstance(value, list | tuple):
        return "" if value is None else str(value)
    return shlex.join(str(part) for part in value)
