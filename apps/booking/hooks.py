"""Hooks other apps plug into; booking calls them after commit and never imports those apps.

`on_reservation_ended(event)` is called once per reservation that ends, whether at its booked end (the lifecycle
task) or early (released by the team), after the transaction that ended it commits. The jobs app registers a
handler that stops the team's jobs still running on `event.gpu_ids` once `event.grace_s` seconds have passed
(e.g. by sending a task with `countdown=event.grace_s`); handlers must be quick and must not raise (errors are
logged and swallowed, so one broken handler cannot stop the others). Default: no handlers, nothing happens.

    from apps.booking.hooks import ReservationEnded, register_reservation_ended

    @register_reservation_ended
    def stop_jobs_after_grace(event: ReservationEnded) -> None: ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReservationEnded:
    """A reservation stopped holding its GPUs at `ended_at` (early: released by the team before its end)."""

    reservation_id: int
    team_id: int
    gpu_ids: tuple[int, ...]
    ended_at: datetime
    early: bool
    grace_s: int


ReservationEndedHandler = Callable[[ReservationEnded], None]
_reservation_ended: list[ReservationEndedHandler] = []


def register_reservation_ended(handler: ReservationEndedHandler) -> ReservationEndedHandler:
    """Register a handler (usable as a decorator); registering the same function twice is a no-op."""
    if handler not in _reservation_ended:
        _reservation_ended.append(handler)
    return handler


def unregister_reservation_ended(handler: ReservationEndedHandler) -> None:
    if handler in _reservation_ended:
        _reservation_ended.remove(handler)


def on_reservation_ended(event: ReservationEnded) -> None:
    """Call every registered handler with `event`."""
    for handler in list(_reservation_ended):
        try:
            handler(event)
        except Exception:
            logger.exception("reservation-ended handler %r failed for reservation %s", handler, event.reservation_id)
