"""iCalendar (RFC 5545) text for reservations: a plain function of plain data, written with `icalendar`
(escaping, line folding, UTC times)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import icalendar


@dataclass(frozen=True)
class Event:
    """One reservation as a calendar event."""

    uid: str
    start: datetime
    end: datetime
    summary: str
    description: str
    status: str  # CONFIRMED | CANCELLED
    stamp: datetime


def render(events: Iterable[Event], *, name: str) -> str:
    calendar = icalendar.Calendar()
    calendar.add("version", "2.0")
    calendar.add("prodid", "-//GPU Portal//Booking//EN")
    calendar.add("calscale", "GREGORIAN")
    calendar.add("method", "PUBLISH")
    calendar.add("x-wr-calname", name)
    for e in events:
        event = icalendar.Event()
        event.add("uid", e.uid)
        event.add("dtstamp", e.stamp.astimezone(UTC))
        event.add("dtstart", e.start.astimezone(UTC))
        event.add("dtend", e.end.astimezone(UTC))
        event.add("summary", e.summary)
        event.add("description", e.description)
        event.add("status", e.status)
        calendar.add_component(event)
    body: bytes = calendar.to_ical()
    return body.decode()
