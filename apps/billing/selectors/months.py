"""The billing calendar: months in the installation's time zone, and which of them are closed."""

from __future__ import annotations

import re
from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils import timezone

from apps.billing import costing
from apps.billing.models import MonthClose, MonthStatus
from apps.core.errors import ValidationFailed

ZERO = Decimal(0)
_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def local_tz() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


def current_month(*, now: datetime | None = None) -> date:
    return costing.month_of(now or timezone.now(), local_tz())


def parse_month(value: str | None, *, now: datetime | None = None, field_name: str = "month") -> date:
    """`YYYY-MM` (default: the current month) as the month's first day; malformed or future months are refused."""
    this_month = current_month(now=now)
    if value in (None, ""):
        return this_month
    match = _MONTH_RE.match(str(value))
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1970:
        raise ValidationFailed("month must look like YYYY-MM.", fields={field_name: ["Expected YYYY-MM."]})
    month = date(int(match.group(1)), int(match.group(2)), 1)
    if month > this_month:
        raise ValidationFailed(
            f"{value} is in the future; there is no usage to show yet.", fields={field_name: ["A future month."]}
        )
    return month


def month_label(month: date) -> str:
    return f"{month:%Y-%m}"


def closed_months() -> set[date]:
    return set(MonthClose.objects.filter(status=MonthStatus.CLOSED).values_list("month", flat=True))


def month_close_of(month: date) -> MonthClose | None:
    return MonthClose.objects.filter(month=month).first()


def open_since() -> datetime | None:
    """Allocations that ended before this instant need no more billing: it is the start of the first month, from
    the earliest closed one on, that is not closed (months before the first close predate it and count as done).
    None when no month was ever closed."""
    closed = sorted(m for m, s in MonthClose.objects.values_list("month", "status") if s == MonthStatus.CLOSED)
    if not closed:
        return None
    # The first month from the earliest closed one on that is not closed (a re-opened month, a gap, or the month
    # after the latest close).
    month = closed[0]
    done = set(closed)
    while month in done:
        month = costing.next_month(month)
    return costing.month_bounds(month, local_tz())[0]
