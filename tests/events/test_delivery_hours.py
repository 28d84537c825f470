"""The webhook page's chart of the last 24 hours counts each attempt in its hour, in any time zone: the hours are
UTC hours on both sides (a zone half an hour off UTC, as India's, once left every bar empty)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.events import selectors, services
from apps.events.models import DeliveryStatus, OutboxEvent, WebhookDelivery

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/St_Johns"])
def test_each_attempt_is_counted_in_its_hour(alice: Any, vision: Any, settings: Any, monkeypatch: Any, zone: str):
    settings.TIME_ZONE = zone
    monkeypatch.setattr("apps.events.services.check_url", lambda url: None)  # no resolver here; not what is tested
    endpoint, _ = services.webhook_create(user=alice, team_slug="vision", url="https://hooks.example.org/x",
                                          events=["job.*"])  # fmt: skip
    now = timezone.now()
    attempts = [(now, DeliveryStatus.SUCCEEDED), (now, DeliveryStatus.FAILED),
                (now - timedelta(hours=3), DeliveryStatus.SUCCEEDED)]  # fmt: skip
    for i, (at, status) in enumerate(attempts):
        event = OutboxEvent.objects.create(created_at=at, event_type="job.succeeded", team=vision, subject=f"j{i}")
        WebhookDelivery.objects.create(event=event, endpoint=endpoint, status=status, attempts=1, next_attempt_at=at,
                                       last_attempt_at=at)  # fmt: skip
    hours = selectors.delivery_hours(endpoint=endpoint)
    assert len(hours) == 24
    assert (hours[-1]["succeeded"], hours[-1]["failed"]) == (1, 1)
    assert (hours[-4]["succeeded"], hours[-4]["failed"]) == (1, 0)
    assert sum(int(str(h["succeeded"])) + int(str(h["failed"])) for h in hours) == 3
