"""The iCal feed as calendar apps use it, read with the `icalendar` library: event UIDs that do not depend on the
host name the feed is fetched under, and conditional GETs (ETag / Last-Modified → 304) for their polling."""

from __future__ import annotations

from typing import Any

import icalendar
import pytest
from django.test import Client
from django.utils import timezone

from apps.booking import services
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


@pytest.fixture
def feed_path(alice: Any, vision: Any, fleet: Any, settings: Any) -> str:
    settings.ALLOWED_HOSTS = ["gpus.example.org", "gpus-old.example.org", "proxy.internal"]
    settings.PORTAL_CALENDAR_UID_DOMAIN = "gpus.example.org"
    for days, gpu in ((1, "GPU-big-0"), (2, "GPU-big-1")):
        start, end = slot(days=days)
        services.reservation_create(user=alice, team=vision, start=start, end=end, gpus=[gpu])
    return f"/book/calendar/{services.calendar_feed_regenerate(user=alice)}.ics"


def _uids(body: bytes) -> list[str]:
    calendar = icalendar.Calendar.from_ical(body)
    return sorted(str(event["UID"]) for event in calendar.walk("VEVENT"))


def test_event_uids_do_not_depend_on_the_host_name(feed_path: str) -> None:
    feeds = [Client(HTTP_HOST=host).get(feed_path) for host in ("gpus.example.org", "proxy.internal")]
    assert [f.status_code for f in feeds] == [200, 200]
    uids = [_uids(f.content) for f in feeds]
    assert uids[0] == uids[1]
    assert len(uids[0]) == 2 and all(uid.endswith("@gpus.example.org") for uid in uids[0])
    assert feeds[0]["ETag"] == feeds[1]["ETag"]


def test_conditional_requests_get_304(feed_path: str, alice: Any, vision: Any) -> None:
    client = Client(HTTP_HOST="gpus.example.org")
    first = client.get(feed_path)
    assert first.status_code == 200
    etag, last_modified = first["ETag"], first["Last-Modified"]
    assert etag.startswith('"') and last_modified.endswith("GMT")

    same = client.get(feed_path, HTTP_IF_NONE_MATCH=etag)
    assert same.status_code == 304 and same.content == b""
    assert same["ETag"] == etag
    assert client.get(feed_path, HTTP_IF_MODIFIED_SINCE=last_modified).status_code == 304
    assert client.get(feed_path, HTTP_IF_NONE_MATCH='"something-else"').status_code == 200
    assert client.get(feed_path, HTTP_IF_MODIFIED_SINCE="Mon, 01 Jan 2001 00:00:00 GMT").status_code == 200

    # A change (a new booking) changes the tag: the old one gets the new calendar.
    start, end = slot(days=3)
    services.reservation_create(user=alice, team=vision, start=start, end=end, gpus=["GPU-big-2"])
    changed = client.get(feed_path, HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert len(_uids(changed.content)) == 3


def test_a_moved_end_is_news_to_a_polling_calendar(feed_path: str, alice: Any) -> None:
    from datetime import timedelta

    from apps.booking.models import Reservation

    # The bookings were made an hour ago: the feed's Last-Modified says so.
    Reservation.objects.update(created_at=timezone.now() - timedelta(hours=1))
    client = Client(HTTP_HOST="gpus.example.org")
    first = client.get(feed_path)
    r = Reservation.objects.order_by("start").first()
    later = r.end + timedelta(hours=1)
    services.reservation_change_end(user=alice, reservation_id=r.pk, end=later)
    # A calendar asking by date alone (If-Modified-Since) gets the new end, not a 304.
    again = client.get(feed_path, HTTP_IF_MODIFIED_SINCE=first["Last-Modified"])
    assert again.status_code == 200 and again["Last-Modified"] != first["Last-Modified"]
    events = {str(e["UID"]): e for e in icalendar.Calendar.from_ical(again.content).walk("VEVENT")}
    moved = next(e for e in events.values() if e["DTEND"].dt == later)
    before = {str(e["UID"]): e for e in icalendar.Calendar.from_ical(first.content).walk("VEVENT")}
    assert moved["DTSTAMP"].dt > before[str(moved["UID"])]["DTSTAMP"].dt
