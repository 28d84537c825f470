"""The iCal feed as calendar apps use it, read with the `icalendar` library: event UIDs that do not depend on the
host name the feed is fetched under, and conditional GETs (ETag / Last-Modified → 304) for their polling."""

from __future__ import annotations

from typing import Any

import icalendar
import pytest
from django.test import Client

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
