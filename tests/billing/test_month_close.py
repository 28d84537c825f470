"""Monthly close: the scheduled freeze, idempotence, closed months never change, re-open by admins (audited)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from apps.audit.models import AuditEvent
from apps.billing import selectors, services
from apps.billing.models import MonthClose, MonthStatus, UsageRecord
from apps.core.errors import Conflict, Forbidden, ValidationFailed
from tests.billing import helpers

pytestmark = pytest.mark.django_db


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture
def october(vision, nlp, bob, charlie):
    gpu_list = helpers.gpus(3)
    helpers.reserve(vision, bob, gpu_list[:2], utc(2026, 10, 3, 8), utc(2026, 10, 4, 20))
    helpers.run_job(nlp, charlie, gpu_list[2], utc(2026, 10, 31, 20), utc(2026, 11, 1, 2))
    return gpu_list


def test_the_first_run_after_the_month_freezes_it_once(october, admin):
    # October is not over: only September (the previous month, empty) is due.
    assert services.close_due_months(now=utc(2026, 10, 31, 23)) == [date(2026, 9, 1)]
    assert services.close_due_months(now=utc(2026, 11, 1, 0, 1)) == []  # over, but inside the close lag
    assert services.close_due_months(now=utc(2026, 11, 1, 1)) == [date(2026, 10, 1)]
    assert services.close_due_months(now=utc(2026, 11, 1, 2)) == []
    closing = MonthClose.objects.get(month=date(2026, 10, 1))
    assert closing.status == MonthStatus.CLOSED and closing.closed_by is None
    assert closing.gpu_seconds == 2 * 36 * 3600 + 4 * 3600
    # The month's last rows were written before the freeze (the job ran into November).
    assert UsageRecord.objects.filter(month=date(2026, 10, 1)).count() == 2 * 2 + 1
    assert set(closing.figures["teams"]) == {"vision", "nlp"}
    assert AuditEvent.objects.filter(action="billing.month_close").count() == 2


def test_a_closed_months_report_is_the_frozen_one(october, admin):
    services.month_close(month=date(2026, 10, 1), now=utc(2026, 11, 2))
    before = selectors.monthly_report(user=admin, month=date(2026, 10, 1))
    # Something changes the ledger behind billing's back: the frozen report does not move.
    UsageRecord.objects.filter(month=date(2026, 10, 1)).update(cost=0)
    after = selectors.monthly_report(user=admin, month=date(2026, 10, 1))
    assert before["teams"] == after["teams"] and before["totals"] == after["totals"]
    assert after["status"] == "closed" and after["closed_at"]


def test_a_month_not_over_cannot_be_closed():
    with pytest.raises(ValidationFailed):
        services.month_close(month=date(2026, 10, 1), now=utc(2026, 10, 20))


def test_admins_reopen_and_close_again_with_audit(october, admin, alice):
    services.month_close(month=date(2026, 10, 1), now=utc(2026, 11, 2))
    with pytest.raises(Forbidden):
        services.month_reopen(month=date(2026, 10, 1), actor=alice)
    services.month_reopen(month=date(2026, 10, 1), actor=admin, reason="missing GPU")
    with pytest.raises(Conflict):
        services.month_reopen(month=date(2026, 10, 1), actor=admin)
    closing = MonthClose.objects.get()
    assert closing.status == MonthStatus.REOPENED and closing.reopened_by == admin
    event = AuditEvent.objects.get(action="billing.month_reopen")
    assert event.actor == admin and event.data["reason"] == "missing GPU"
    # Re-opened: the scheduled task leaves it alone; new usage can be billed into it; an admin closes it again.
    assert services.close_due_months(now=utc(2026, 11, 3)) == []
    late = helpers.gpus(1, node="late-node")[0]
    helpers.run_job(october[0].allocations.first().team, None, late, utc(2026, 10, 20), utc(2026, 10, 20, 1))
    services.ledger_close(now=utc(2026, 11, 3))
    services.month_close(month=date(2026, 10, 1), actor=admin, now=utc(2026, 11, 3))
    closing.refresh_from_db()
    assert closing.status == MonthStatus.CLOSED and closing.gpu_seconds == 2 * 36 * 3600 + 4 * 3600 + 3600
    assert AuditEvent.objects.filter(action="billing.month_close").count() == 2


def test_admin_action_reopens(october, admin, client):
    services.month_close(month=date(2026, 10, 1), now=utc(2026, 11, 2))
    client.force_login(admin)
    closing = MonthClose.objects.get()
    resp = client.post(
        "/admin/billing/monthclose/",
        {"action": "reopen_months", "_selected_action": [closing.pk]},
        follow=True,
    )
    assert resp.status_code == 200
    closing.refresh_from_db()
    assert closing.status == MonthStatus.REOPENED
    assert AuditEvent.objects.filter(action="billing.month_reopen", actor=admin).exists()


def test_months_with_rows_but_never_closed_are_caught_up(vision, bob):
    [gpu] = helpers.gpus(1)
    helpers.reserve(vision, bob, [gpu], utc(2026, 7, 3), utc(2026, 7, 4))
    services.ledger_close(now=utc(2026, 7, 10))
    assert services.close_due_months(now=utc(2026, 10, 1, 12)) == [date(2026, 7, 1), date(2026, 9, 1)]
    assert selectors.closed_months() == {date(2026, 7, 1), date(2026, 9, 1)}
    # August (no rows, not the previous month) stays open, so the closer still looks at it.
    assert selectors.open_since() == utc(2026, 8, 1)
    services.month_close(month=date(2026, 8, 1), now=utc(2026, 10, 1, 12))
    assert selectors.open_since() == utc(2026, 10, 1)
