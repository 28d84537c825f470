"""A reservation's changes as portal events (webhooks and mail, apps/events), written in the caller's transaction."""

from __future__ import annotations

from apps.booking.models import Reservation
from apps.booking.services.conflicts import iso
from apps.events.services import publish


def publish_reservation(event_type: str, reservation: Reservation, *, status: str, **extra: object) -> None:
    """`event_type` is "reservation.created", ".started", ".moved", ".changed", ".ended" or ".released"; `status` is
    the one it has now (the caller's object may still hold the old one)."""
    data: dict[str, object] = {
        "id": reservation.pk,
        "status": status,
        "start": iso(reservation.start),
        "end": iso(reservation.end),
        "booked_end": iso(reservation.booked_end),
        "gpu_count": reservation.gpu_count,
        "note": reservation.note,
        **extra,
    }
    publish(
        event_type,
        team_id=reservation.team_id,
        subject=f"reservations/{reservation.pk}",
        data=data,
        user_id=reservation.user_id,
    )
