"""'Starting soon' is published once per booked reservation, RESERVATION_REMINDER_S before its start."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.booking import services as booking
from apps.events.models import OutboxEvent
from apps.events.reminders import remind_reservations_starting
from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db


def test_a_reservation_about_to_start_is_reminded_once(alice: Any, vision: Any) -> None:
    gpus = [GpuFactory(node__name="remind-node", index=i) for i in range(2)]
    now = timezone.now()
    soon = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(minutes=15)
    near = booking.reservation_create(
        user=alice, team=vision, start=soon, end=soon + timedelta(hours=1), gpus=[gpus[0].uuid]
    ).reservation
    far = booking.reservation_create(
        user=alice, team=vision, start=soon + timedelta(days=1), end=soon + timedelta(days=1, hours=1),
        gpus=[gpus[1].uuid],
    ).reservation  # fmt: skip

    assert remind_reservations_starting(now=now) == [near.pk]
    assert remind_reservations_starting(now=now + timedelta(seconds=30)) == []
    event = OutboxEvent.objects.get(event_type="reservation.starting_soon")
    assert (event.subject, event.user_id, event.team_id) == (f"reservations/{near.pk}", alice.pk, vision.pk)
    # The day after, the other one's turn comes.
    assert remind_reservations_starting(now=far.start - timedelta(minutes=10)) == [far.pk]


def test_bookings_reminded_already_do_not_hold_back_the_next(alice: Any, vision: Any) -> None:
    """A pass takes `limit` bookings: those reminded already are not among them, or `limit` reminded bookings
    starting within the window would keep every later one from its reminder."""
    gpus = [GpuFactory(node__name="remind-many", index=i) for i in range(3)]
    now = timezone.now()
    soon = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(minutes=15)
    booked = [
        booking.reservation_create(
            user=alice, team=vision, start=soon, end=soon + timedelta(hours=1), gpus=[gpu.uuid]
        ).reservation
        for gpu in gpus
    ]
    first = remind_reservations_starting(now=now, limit=2)
    assert len(first) == 2
    assert remind_reservations_starting(now=now, limit=2) == [r.pk for r in booked if r.pk not in first]
    assert remind_reservations_starting(now=now, limit=2) == []
    assert OutboxEvent.objects.filter(event_type="reservation.starting_soon").count() == 3
