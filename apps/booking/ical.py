"""iCalendar (RFC 5545) text for reservations: a plain function of plain data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime


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


def _escape(text: str) -> str:
    return (
        text.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\r\n", "\\n").replace("\n", "\\n")
    )


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _fold(line: str) -> list[str]:
    """Lines longer than 75 octets continue on the next line after a space (RFC 5545 3.1)."""
    out: list[str] = []
    data = line.encode()
    while len(data) > 75:
        cut = 75 if not out else 74
        while cut > 0 and (data[cut] & 0xC0) == 0x80:  # never split inside a UTF-8 sequence
            cut -= 1
        out.append(data[:cut].decode())
        data = data[cut:]
    out.append(data.decode())
    return [out[0], *(" " + part for part in out[1:])]


def render(events: Iterable[Event], *, name: str) -> str:
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//GPU Portal//Booking//EN",
        "CALSCALE:GREGORIAN",
        "METHOD:PUBLISH",
        f"X-WR-CALNAME:{_escape(name)}",
    ]
    for e in events:
        lines += [
            "BEGIN:VEVENT",
            f"UID:{e.uid}",
            f"DTSTAMP:{_utc(e.stamp)}",
            f"DTSTART:{_utc(e.start)}",
            f"DTEND:{_utc(e.end)}",
            f"SUMMARY:{_escape(e.summary)}",
            f"DESCRIPTION:{_escape(e.description)}",
            f"STATUS:{e.status}",
            "END:VEVENT",
        ]
    lines.append("END:VCALENDAR")
    return "\r\n".join(folded for line in lines for folded in _fold(line)) + "\r\n"
