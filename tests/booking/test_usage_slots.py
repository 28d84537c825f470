"""A team's monthly usage is spread over several rows (slots): amounts counted without a check (a
team without limits, a job's refund at its end) take a free slot instead of queueing on one row, while a quota
check locks every slot, so it waits for those writes and counts them. Two real connections (threads)."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.booking import quota as quota_math
from apps.booking import selectors, services
from apps.booking.models import QuotaUsage
from apps.booking.services import quotas
from apps.core.errors import QuotaExceeded

pytestmark = pytest.mark.django_db(transaction=True)


def this_month() -> Any:
    return quota_math.month_of(timezone.now(), selectors.local_tz())


class HeldAdd(threading.Thread):
    """In its own connection: add `hours` to the team's usage and keep the transaction open until released."""

    def __init__(self, team_id: int, hours: str) -> None:
        super().__init__(daemon=True)
        self.team_id, self.hours = team_id, Decimal(hours)
        self.added, self.release, self.error = threading.Event(), threading.Event(), None

    def run(self) -> None:
        try:
            with transaction.atomic():
                quotas.add_usage(self.team_id, {this_month(): quota_math.Amount(self.hours, self.hours * 2)})
                self.added.set()
                assert self.release.wait(30)
        except Exception as exc:  # pragma: no cover - reported by the test
            self.error = exc
            self.added.set()
        finally:
            connection.close()


def test_adds_without_a_check_do_not_wait_for_each_other(vision):
    month = this_month()
    # The month's first row exists (committed); the very first add of a month creates it, and a concurrent first
    # add waits for that insert to commit.
    quotas.add_usage(vision.pk, {month: quota_math.Amount(Decimal("1"), Decimal("2"))})
    held = HeldAdd(vision.pk, "1")
    held.start()
    assert held.added.wait(30) and held.error is None
    try:
        with transaction.atomic():
            # Would fail with "lock timeout" if it queued behind the open transaction's row.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '1s'")
            quotas.add_usage(vision.pk, {month: quota_math.Amount(Decimal("3"), Decimal("6"))})
    finally:
        held.release.set()
        held.join(30)
    assert held.error is None
    rows = QuotaUsage.objects.filter(team=vision, month=month)
    assert rows.count() == 2 and {r.slot for r in rows} >= {0}
    assert selectors.usage_by_month(team_id=vision.pk, months=[month])[month] == quota_math.Amount(
        Decimal("5.0000"), Decimal("10.0000")
    )
    assert selectors.quota_summary(team=vision, month=month)["booked"]["gpu_hours"] == "5.0000"


def test_a_quota_check_waits_for_an_add_in_flight_and_counts_it(vision, quota):
    """Usage 4 h is being committed in another transaction; a check for 2 h more against a 5 h quota waits for it
    and refuses, instead of reading 0 and letting the team end at 6 h."""
    quota(gpu_hours=Decimal("5"))
    month = this_month()
    held = HeldAdd(vision.pk, "4")
    held.start()
    assert held.added.wait(30) and held.error is None
    outcome: dict[str, Any] = {}

    def check() -> None:
        start = timezone.now() + timedelta(hours=1)
        start = start.replace(minute=0, second=0, microsecond=0)
        if quota_math.month_of(start + timedelta(hours=2), selectors.local_tz()) != month:
            start -= timedelta(hours=4)  # stay inside this month near its end
        try:
            with transaction.atomic():
                services.quota_check_and_hold(
                    team=vision, gpu_count=1, start=start, end=start + timedelta(hours=2),
                    hourly_rate=Decimal("1"), kind="job", job_id=424242,
                )  # fmt: skip
            outcome["result"] = "held"
        except QuotaExceeded as exc:
            outcome["result"] = exc.code
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            outcome["result"] = repr(exc)
        finally:
            connection.close()

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    checker.join(1.0)
    try:
        assert checker.is_alive(), f"the check did not wait for the uncommitted usage: {outcome}"
    finally:
        held.release.set()
        held.join(30)
        checker.join(30)
    assert outcome.get("result") == "quota_exceeded", outcome
    assert selectors.usage_by_month(team_id=vision.pk, months=[month])[month].gpu_hours == Decimal("4.0000")
