"""Budget alerts at 80% and 100% of a team's budget, once each per month: portal notification and e-mail to the
team's managers; pushed to the team's sockets by the live broadcast."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from channels.layers import get_channel_layer
from django.core import mail

from apps.billing import services
from apps.billing.models import BudgetAlert, Notification
from apps.booking.models import Quota
from tests.billing import helpers

pytestmark = pytest.mark.django_db
START = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture
def spending(vision, alice, bob):
    """vision holds 4 GPUs at 2.50/h from Oct 1: 10/h, so cost = 10 x hours since START."""
    Quota.objects.create(team=vision, budget_soft=Decimal("100"), budget_hard=Decimal("150"))
    helpers.reserve(vision, bob, helpers.gpus(4), START, START + timedelta(days=40))
    return vision


def at_cost(amount: float) -> datetime:
    return START + timedelta(hours=amount / 10)


def test_alerts_fire_once_each_at_80_and_100_percent(spending, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert services.budget_check(team_id=spending.pk, now=at_cost(50)) == []
        [first] = services.budget_check(team_id=spending.pk, now=at_cost(85))
        assert services.budget_check(team_id=spending.pk, now=at_cost(90)) == []
        [second] = services.budget_check(team_id=spending.pk, now=at_cost(101))
        assert services.budget_check(team_id=spending.pk, now=at_cost(140)) == []
    assert (first.threshold, second.threshold) == (80, 100)
    assert first.cost == Decimal("85") and first.budget == Decimal("100")
    notes = list(Notification.objects.filter(team=spending).order_by("created_at"))
    assert [n.level for n in notes] == ["warning", "danger"]
    assert "80%" in notes[0].title and "whole" in notes[1].title and "150" in notes[1].body
    assert [m.to for m in mail.outbox] == [["alice@example.org"], ["alice@example.org"]]  # managers only
    assert "80%" in mail.outbox[0].subject


def test_a_new_month_fires_again(spending, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        services.budget_check(team_id=spending.pk, now=at_cost(120))
        services.budget_check(team_id=spending.pk, now=datetime(2026, 11, 1, 12, tzinfo=UTC))  # 120 in November
    assert sorted(BudgetAlert.objects.values_list("month", "threshold")) == [
        (date(2026, 10, 1), 80),
        (date(2026, 10, 1), 100),
        (date(2026, 11, 1), 80),
        (date(2026, 11, 1), 100),
    ]


def test_no_budget_no_alert(vision, bob):
    helpers.reserve(vision, bob, helpers.gpus(4), START, START + timedelta(days=3))
    assert services.budget_check(team_id=vision.pk, now=START + timedelta(days=2)) == []


def test_the_database_decides_who_fires(spending):
    """Two checks that both saw no alert yet: the unique (team, month, threshold) row lets one through."""
    BudgetAlert.objects.create(team=spending, month=date(2026, 10, 1), threshold=80, budget=100, cost=81)
    # A check that read the alert list before that row existed still cannot fire twice:
    fired = services.budget_check(team_id=spending.pk, now=at_cost(85))
    assert fired == []
    assert BudgetAlert.objects.count() == 1 and Notification.objects.count() == 0


class Listener:
    """A channel in the team's group, read from one event loop of its own (channels-redis binds its receive
    buffer to the loop that first receives)."""

    def __init__(self, group: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.layer = get_channel_layer()
        self.channel = self.loop.run_until_complete(self.layer.new_channel())
        self.loop.run_until_complete(self.layer.group_add(group, self.channel))

    def drain(self) -> list[dict]:
        async def drain() -> list[dict]:
            out = []
            while True:
                try:
                    out.append(await asyncio.wait_for(self.layer.receive(self.channel), 1.0))
                except TimeoutError:
                    return out

        return self.loop.run_until_complete(drain())


def test_broadcast_pushes_changed_figures_and_fires_alerts(spending, django_capture_on_commit_callbacks):
    listener = Listener(services.team_group(spending.pk))
    with django_capture_on_commit_callbacks(execute=True):
        assert services.broadcast_team_costs(now=at_cost(85)) == [spending.pk]
    usage, note = listener.drain()
    assert usage["type"] == "team_usage" and usage["data"]["cost"] == "85.00" and usage["data"]["team"] == "vision"
    assert usage["data"]["running_gpus"] == 4 and usage["data"]["budget_used"] == "0.8500"
    assert note["type"] == "team_notification" and note["data"]["level"] == "warning"
    # Unchanged figures are not pushed again; changed ones are.
    assert services.broadcast_team_costs(now=at_cost(85)) == []
    assert services.broadcast_team_costs(now=at_cost(86)) == [spending.pk]
    assert [m["data"]["cost"] for m in listener.drain()] == ["86.00"]
    listener.loop.close()


def test_header_badge_shows_recent_notifications(spending, alice, charlie, django_capture_on_commit_callbacks):
    from django.template import Context, Template

    with django_capture_on_commit_callbacks(execute=True):
        services.budget_check(team_id=spending.pk)  # now: nothing spent this month, no alert
    Notification.objects.create(team=spending, level="danger", title="vision has used its whole budget")
    tmpl = Template("{% load billing_tags %}{% billing_notifications %}")
    assert "⚠ 1" in tmpl.render(Context({"user": alice})) and "whole budget" in tmpl.render(Context({"user": alice}))
    assert tmpl.render(Context({"user": charlie})).strip() == ""


def test_a_manager_who_turned_budget_mail_off_gets_none(spending, alice, django_capture_on_commit_callbacks):
    from apps.events.models import MailPreference

    MailPreference.objects.create(user=alice, budget_thresholds=False)
    with django_capture_on_commit_callbacks(execute=True):
        [alert] = services.budget_check(team_id=spending.pk, now=at_cost(85))
    assert alert.threshold == 80
    assert mail.outbox == []
    assert Notification.objects.filter(team=spending).count() == 1  # the portal notification still appears
