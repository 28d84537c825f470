"""A reservation's changes as portal events (webhooks and mail, apps/events), written in the caller's transaction,
and told to open Book pages after its commit (apps/booking/live.py)."""

from __future__ import annotations

from datetime import datetime

from apps.booking import live
from apps.booking.models import Reservation
from apps.booking.services.conflicts import iso
from apps.events.services import publish


def publish_reservation(event_type: str, reservation: Reservation, *, status: str, **extra: object) -> None:
    """`event_type` is "reservation.created", ".started", ".moved", ".changed", ".ended" or ".released"; `status` is
    the one it has now (the caller's object may still hold the old one). `extra` goes into the event's data; a
    `previous_end` (a datetime, where its end moved) also widens the time open Book pages are told of."""
    previous_end = extra.pop("previous_end", None)
    if not isinstance(previous_end, datetime):
        previous_end = None
    data: dict[str, object] = {
        "id": reservation.pk,
        "status": status,
        "start": iso(reservation.start),
        "end": iso(reservation.end),
        "booked_end": iso(reservation.booked_end),
        "gpu_count": reservation.gpu_count,
        "note": reservation.note,
        **({"previous_end": iso(previous_end)} if previous_end is not None else {}),
        **extra,
    }
    publish(
        event_type,
        team_id=reservation.team_id,
        subject=f"reservations/{reservation.pk}",
        data=data,
        user_id=reservation.user_id,
    )
    # The time the change touches: its window (to its booked end, for one released early) and, when its end moved,
    # the time it held before.
    touched_end = max(e for e in (reservation.end, reservation.booked_end, previous_end) if e is not None)
    live.announce_on_commit(team_id=reservation.team_id, start=reservation.start, end=touched_end)
