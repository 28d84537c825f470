"""iCalendar (RFC 5545) text for reservations: a plain function of plain data, written with `icalendar`
(escaping, line folding, UTC times)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import icalendar
from django.conf import settings


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


def event_uid(kind: str, pk: int) -> str:
    """A UID that stays the same for the event's life whatever host name the feed is fetched under (RFC 5545:
    globally unique and persistent), from the PORTAL_CALENDAR_UID_DOMAIN setting."""
    return f"{kind}-{pk}@{settings.PORTAL_CALENDAR_UID_DOMAIN}"


def etag(body: str) -> str:
    """A strong validator of the feed's text: equal bodies, equal tags."""
    return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'
