"""Hooks other apps plug into; booking calls them after commit and never imports those apps.

`on_reservation_ended(event)` is called once per reservation that ends, whether at its booked end (the lifecycle
task) or early (released by the team), after the transaction that ended it commits. The jobs app registers a
handler that stops the team's jobs still running on `event.gpu_ids` once `event.grace_s` seconds have passed
(e.g. by sending a task with `countdown=event.grace_s`); handlers must be quick and must not raise (errors are
logged and swallowed, so one broken handler cannot stop the others). Default: no handlers, nothing happens.

    from apps.booking.hooks import ReservationEnded, register_reservation_ended

    @register_reservation_ended
    def stop_jobs_after_grace(event: ReservationEnded) -> None: ...

`on_reservation_rehomed(event)` is called after commit for each reservation a GPU layout change (or a GPU gone
from its node) moved to other devices or ended (`services/stranded.py`); the efficiency app tells the holder's
open pages. Same rules.

`on_reservation_shortened(event)` is called after commit when a reservation's end moved earlier
(`services/reschedule.py`): its GPUs are free from `freed_from` to `freed_until`; the efficiency app offers that
time to the waitlist at once, as after an early release. Same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

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


@dataclass(frozen=True)
class ReservationRehomed:
    """A layout change or a gone GPU took a reservation's devices (`reason`: "layout" or "gpu_gone"): it moved
    (`moved`: old device uuid -> new one) or, with no equal device free, it was ended (`ended`; `message` says why
    in words)."""

    reservation_id: int
    team_id: int
    user_id: int | None
    ended: bool
    reason: str = "layout"
    message: str = ""
    moved: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReservationShortened:
    """A reservation's end moved from `freed_until` to `freed_from`: its GPUs (or devices) are free in between."""

    reservation_id: int
    team_id: int
    gpu_ids: tuple[int, ...]
    freed_from: datetime
    freed_until: datetime


E = TypeVar("E", ReservationEnded, ReservationRehomed, ReservationShortened)


class _Handlers(Generic[E]):
    """The handlers of one hook: registered once each, called in order, each one's failure logged and swallowed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handlers: list[Callable[[E], None]] = []

    def register(self, handler: Callable[[E], None]) -> Callable[[E], None]:
        if handler not in self.handlers:
            self.handlers.append(handler)
        return handler

    def unregister(self, handler: Callable[[E], None]) -> None:
        if handler in self.handlers:
            self.handlers.remove(handler)

    def call(self, event: E) -> None:
        for handler in list(self.handlers):
            try:
                handler(event)
            except Exception:
                logger.exception("%s handler %r failed for reservation %s", self.name, handler, event.reservation_id)


ReservationEndedHandler = Callable[[ReservationEnded], None]
_ended: _Handlers[ReservationEnded] = _Handlers("reservation-ended")
_reservation_ended = _ended.handlers
_rehomed: _Handlers[ReservationRehomed] = _Handlers("reservation-rehomed")
_shortened: _Handlers[ReservationShortened] = _Handlers("reservation-shortened")


def register_reservation_ended(handler: ReservationEndedHandler) -> ReservationEndedHandler:
    """Register a handler (usable as a decorator); registering the same function twice is a no-op."""
    return _ended.register(handler)


def unregister_reservation_ended(handler: ReservationEndedHandler) -> None:
    _ended.unregister(handler)


def on_reservation_ended(event: ReservationEnded) -> None:
    """Call every registered handler with `event`."""
    _ended.call(event)


# The other hooks, the same three calls each: register (usable as a decorator), unregister, call every handler.
register_reservation_rehomed = _rehomed.register
unregister_reservation_rehomed = _rehomed.unregister
on_reservation_rehomed = _rehomed.call

register_reservation_shortened = _shortened.register
unregister_reservation_shortened = _shortened.unregister
on_reservation_shortened = _shortened.call
