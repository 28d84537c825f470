""" "Your reservation starts soon": published once per reservation, RESERVATION_REMINDER_S before its start."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import CharField, Exists, OuterRef, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from apps.booking.models import Reservation, ReservationStatus
from apps.events import conf
from apps.events.models import EventType, OutboxEvent
from apps.events.services import publish


def remind_reservations_starting(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Publish reservation.starting_soon for booked reservations starting within the reminder window that have
    not had one. The reservation rows are locked (SKIP LOCKED) while checked, so two runs remind once."""
    now = now or timezone.now()
    window_end = now + timedelta(seconds=conf.RESERVATION_REMINDER_S)
    reminded: list[int] = []
    # Those reminded already are left out by the query, not skipped after it: skipped, `limit` of them would keep
    # every later booking in the window from its reminder.
    reminded_already = OutboxEvent.objects.filter(
        event_type=EventType.RESERVATION_STARTING_SOON,
        subject=Concat(Value("reservations/"), Cast(OuterRef("pk"), output_field=CharField())),
    )
    with transaction.atomic():
        due = (
            Reservation.objects.select_for_update(skip_locked=True)
            .filter(status=ReservationStatus.BOOKED, start__gt=now, start__lte=window_end)
            .exclude(Exists(reminded_already))
            .order_by("start")[:limit]
        )
        for reservation in due:
            subject = f"reservations/{reservation.pk}"
            # Again under the row's lock, in a statement of its own: a run that committed between this one's query
            # and its lock is seen here (READ COMMITTED), not by the query's snapshot.
            if OutboxEvent.objects.filter(event_type=EventType.RESERVATION_STARTING_SOON, subject=subject).exists():
                continue
            publish(
                EventType.RESERVATION_STARTING_SOON,
                team_id=reservation.team_id,
                subject=subject,
                data={
                    "id": reservation.pk,
                    "start": reservation.start.isoformat(),
                    "end": reservation.end.isoformat(),
                    "gpu_count": reservation.gpu_count,
                    "note": reservation.note,
                },
                user_id=reservation.user_id,
            )
            reminded.append(reservation.pk)
    return reminded
