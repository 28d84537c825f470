"""publish() writes the outbox row in the caller's transaction; fan-out creates each delivery once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from apps.events import outbox, secrets
from apps.events.matching import backoff_s, pattern_is_valid, selects
from apps.events.models import MailDelivery, MailPreference, OutboxEvent, WebhookDelivery, WebhookEndpoint
from apps.events.services import publish

pytestmark = pytest.mark.django_db


def _endpoint(team: Any, events: list[str]) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(
        team=team, url="https://example.org/hook", events=events, secret_encrypted=secrets.encrypt(secrets.new_secret())
    )


def test_publish_writes_an_outbox_row(vision: Any, alice: Any) -> None:
    publish("job.succeeded", team_id=vision.pk, subject="jobs/7", data={"id": 7}, user_id=alice.pk)
    event = OutboxEvent.objects.get()
    assert (event.event_type, event.team_id, event.user_id, event.subject, event.data) == (
        "job.succeeded",
        vision.pk,
        alice.pk,
        "jobs/7",
        {"id": 7},
    )
    assert event.dispatched_at is None


def test_an_event_rolled_back_with_its_change_is_not_published(vision: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("job.failed", team_id=vision.pk, subject="jobs/8", data={})
        raise RuntimeError("the change failed")
    assert not OutboxEvent.objects.exists()


def test_fan_out_selects_endpoints_by_team_and_pattern_once(vision: Any, nlp: Any, alice: Any) -> None:
    jobs = _endpoint(vision, ["job.*"])
    _endpoint(vision, ["reservation.*"])
    _endpoint(nlp, ["*"])
    everything = _endpoint(None, ["job.succeeded"])
    MailPreference.objects.create(user=alice, job_finished=True)
    publish("job.succeeded", team_id=vision.pk, subject="jobs/9", data={}, user_id=alice.pk)
    event = OutboxEvent.objects.get()

    owed = outbox.dispatch_event(event.pk)
    again = outbox.dispatch_event(event.pk)

    assert sorted(WebhookDelivery.objects.values_list("endpoint_id", flat=True)) == sorted([jobs.pk, everything.pk])
    assert len(owed.webhooks) == 2 and again.webhooks == []
    assert list(MailDelivery.objects.values_list("user_id", flat=True)) == [alice.pk]


def test_the_sweep_fans_out_what_a_lost_message_left(vision: Any) -> None:
    endpoint = _endpoint(vision, ["node.down"])
    publish("node.down", team_id=vision.pk, subject="nodes/n1", data={})
    owed = outbox.sweep()
    delivery = WebhookDelivery.objects.get()
    assert delivery.endpoint_id == endpoint.pk and owed.webhooks == [delivery.pk]


def test_patterns() -> None:
    assert selects(["job.*"], "job.lost") and not selects(["job.*"], "jobs.lost")
    assert selects(["*"], "node.up") and selects(["node.up"], "node.up") and not selects(["node.up"], "node.down")
    assert pattern_is_valid("reservation.*") and pattern_is_valid("budget.threshold")
    assert not pattern_is_valid("nope.*") and not pattern_is_valid("job.exploded")
    assert [backoff_s(n, base_s=5, max_s=60) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]


@pytest.mark.django_db(transaction=True)
def test_a_commit_nudges_the_fan_out_through_the_broker(vision: Any) -> None:
    """After commit (not before), one `events.dispatch_many` message naming the event reaches the broker."""
    import base64
    import json
    import time

    from apps.core.redis import get_redis

    def nudged() -> set[int]:
        ids: set[int] = set()
        for raw in get_redis().lrange("portal", 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == "events.dispatch_many":
                args, _, _ = json.loads(base64.b64decode(message["body"]))
                ids.update(args[0])
        return ids

    with transaction.atomic():
        publish("node.up", team_id=None, subject="nodes/n1", data={})
        event_id = OutboxEvent.objects.get().pk
        assert event_id not in nudged()  # nothing is queued before the commit
    deadline = time.monotonic() + 10
    while event_id not in nudged() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert event_id in nudged()


def test_old_events_that_owe_nothing_are_purged(vision: Any, alice: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.events import conf
    from apps.events.models import DeliveryStatus

    _endpoint(vision, ["job.*"])
    for i in range(3):
        publish("job.succeeded", team_id=vision.pk, subject=f"jobs/{i}", data={})
    outbox.sweep()
    first, second, third = OutboxEvent.objects.order_by("id")
    WebhookDelivery.objects.filter(event__in=[first, second]).update(status=DeliveryStatus.SUCCEEDED)
    old = timezone.now() - timedelta(days=conf.RETENTION_DAYS + 1)
    OutboxEvent.objects.filter(pk__in=[first.pk, third.pk]).update(created_at=old)

    outbox.purge()

    # first: old and delivered, gone; second: delivered but recent; third: old but still owed.
    assert list(OutboxEvent.objects.order_by("id").values_list("pk", flat=True)) == [second.pk, third.pk]
    assert WebhookDelivery.objects.count() == 2


def test_a_waitlist_offer_is_mailed_whatever_the_preferences(vision: Any, bob: Any) -> None:
    publish("waitlist.available", team_id=vision.pk, subject="waitlist/3", data={"free": 2}, user_id=bob.pk)
    outbox.sweep()
    assert list(MailDelivery.objects.values_list("user_id", flat=True)) == [bob.pk]
    assert selects(["waitlist.*"], "waitlist.available") and pattern_is_valid("waitlist.*")
