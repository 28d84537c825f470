"""One delivery attempt, in process: signing, backoff, SSRF checked again at delivery, and an endpoint failing
for a day disabled with its owner told (mail and audit)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.events import conf, delivery, outbox
from apps.events.models import DeliveryStatus, MailDelivery, OutboxEvent, WebhookDelivery, WebhookEndpoint
from apps.events.services import publish, webhook_create, webhook_rotate_secret
from tests.conftest import free_port
from tests.events.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.stop()


@pytest.fixture
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conf, "ALLOWED_NETWORKS", ["127.0.0.0/8"])


def _owed(endpoint: WebhookEndpoint, vision: Any, event_type: str = "job.failed") -> WebhookDelivery:
    publish(event_type, team_id=vision.pk, subject="jobs/1", data={"id": 1})
    event = OutboxEvent.objects.latest("id")
    outbox.dispatch_event(event.pk)
    return WebhookDelivery.objects.get(event=event, endpoint=endpoint)


def test_a_failed_attempt_backs_off_and_the_retry_carries_the_same_webhook_id(
    receiver: Receiver, loopback_allowed: None, alice: Any, vision: Any
) -> None:
    endpoint, receiver.secret = webhook_create(user=alice, team_slug="vision", url=receiver.url, events=["job.*"])
    owed = _owed(endpoint, vision)

    first_delay = delivery.deliver_webhook(owed.pk)  # the receiver answers the first attempt with a 500
    owed.refresh_from_db()
    assert first_delay == conf.BACKOFF_BASE_S and owed.status == DeliveryStatus.FAILED and owed.response_code == 500
    assert delivery.deliver_webhook(owed.pk) is None and owed.attempts == 1  # not due yet: nothing sent
    WebhookDelivery.objects.filter(pk=owed.pk).update(next_attempt_at=timezone.now())
    assert delivery.deliver_webhook(owed.pk) is None
    owed.refresh_from_db()
    assert (owed.status, owed.attempts, owed.response_code) == (DeliveryStatus.SUCCEEDED, 2, 200)
    assert [r.webhook_id for r in receiver.received] == [owed.webhook_id] * 2 and receiver.rejected == []


def test_a_rotated_secret_signs_the_next_attempt(
    receiver: Receiver, loopback_allowed: None, alice: Any, vision: Any
) -> None:
    endpoint, old = webhook_create(user=alice, team_slug="vision", url=receiver.url, events=["job.*"])
    owed = _owed(endpoint, vision)
    _, new = webhook_rotate_secret(user=alice, endpoint_id=endpoint.pk)
    receiver.secret = old
    delivery.deliver_webhook(owed.pk)
    assert len(receiver.rejected) == 1 and receiver.received == []  # the old secret no longer verifies
    receiver.secret = new
    WebhookDelivery.objects.filter(pk=owed.pk).update(next_attempt_at=timezone.now())
    delivery.deliver_webhook(owed.pk)
    assert [r.answered for r in receiver.received] == [500]  # verified with the new one (first attempt: 500)


def test_an_address_no_longer_allowed_is_refused_at_delivery(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, alice: Any, vision: Any
) -> None:
    monkeypatch.setattr(conf, "ALLOWED_NETWORKS", ["127.0.0.0/8"])
    endpoint, receiver.secret = webhook_create(user=alice, team_slug="vision", url=receiver.url, events=["job.*"])
    owed = _owed(endpoint, vision)
    monkeypatch.setattr(conf, "ALLOWED_NETWORKS", [])
    delivery.deliver_webhook(owed.pk)
    owed.refresh_from_db()
    assert owed.status == DeliveryStatus.FAILED and owed.response_code is None and "127.0.0.1" in owed.error
    assert receiver.received == [] and receiver.rejected == []


def test_an_endpoint_failing_for_a_day_is_disabled_and_its_owner_told(
    loopback_allowed: None, alice: Any, vision: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: connection refused
    endpoint, _ = webhook_create(user=alice, team_slug="vision", url=dead, events=["job.*"])
    owed = _owed(endpoint, vision)
    delivery.deliver_webhook(owed.pk)
    endpoint.refresh_from_db()
    assert endpoint.is_active and endpoint.failing_since is not None

    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(seconds=conf.DISABLE_AFTER_S + 60)
    )
    WebhookDelivery.objects.filter(pk=owed.pk).update(next_attempt_at=timezone.now())
    delivery.deliver_webhook(owed.pk)
    endpoint.refresh_from_db()
    assert not endpoint.is_active and endpoint.disabled_at is not None
    assert AuditEvent.objects.filter(action="webhook.disabled", target_id=str(endpoint.pk)).count() == 1
    told = OutboxEvent.objects.get(event_type="webhook.disabled")
    assert told.user_id == alice.pk
    outbox.dispatch_event(told.pk)
    assert list(MailDelivery.objects.filter(event=told).values_list("user_id", flat=True)) == [alice.pk]
    # Disabled: nothing is attempted any more, and the sweep does not offer it.
    WebhookDelivery.objects.filter(pk=owed.pk).update(next_attempt_at=timezone.now())
    assert delivery.deliver_webhook(owed.pk) is None and owed.pk not in outbox.sweep().webhooks
    # Rotating the secret brings it back.
    webhook_rotate_secret(user=alice, endpoint_id=endpoint.pk)
    endpoint.refresh_from_db()
    assert endpoint.is_active and endpoint.failing_since is None


def test_an_unreadable_secret_is_a_failed_attempt_that_says_so(
    receiver: Receiver, loopback_allowed: None, alice: Any, vision: Any
) -> None:
    endpoint, _ = webhook_create(user=alice, team_slug="vision", url=receiver.url, events=["job.*"])
    owed = _owed(endpoint, vision)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret_encrypted="encrypted-with-another-SECRET_KEY")
    assert delivery.deliver_webhook(owed.pk) == conf.BACKOFF_BASE_S
    owed.refresh_from_db()
    assert owed.status == DeliveryStatus.FAILED and "rotate it" in owed.error and receiver.received == []
