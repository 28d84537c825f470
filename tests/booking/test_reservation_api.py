"""Reservations API and pages by role (owner, teammate, outsider, admin, anonymous), list filters, the timeline's
privacy, the Book page and the iCal feed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.booking import services
from apps.booking.models import Reservation, ReservationStatus
from tests.booking.conftest import book_body, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def cast(alice, bob, charlie, admin) -> dict[str, Any]:
    return {"owner": alice, "teammate": bob, "outsider": charlie, "admin": admin, "anonymous": None}


def _book(user: Any, team: Any, *, gpus: list[str], days: int = 1, note: str = "") -> Reservation:
    start, end = slot(days=days)
    return services.reservation_create(user=user, team=team, start=start, end=end, gpus=gpus, note=note).reservation


@pytest.fixture
def alices(alice, vision, fleet) -> Reservation:
    return _book(alice, vision, gpus=["GPU-big-0"], note="secret vision note")


@pytest.mark.parametrize(
    "who,status,count",
    [("owner", 200, 1), ("teammate", 200, 1), ("outsider", 200, 0), ("admin", 200, 1), ("anonymous", 401, None)],
)
def test_list_by_role(cast, api_as, alices, who, status, count):
    resp = api_as(cast[who]).get(URL)
    assert resp.status_code == status
    if count is not None:
        assert resp.json()["count"] == count
        assert "secret vision note" not in resp.content.decode() or count


@pytest.mark.parametrize(
    "who,status", [("owner", 200), ("teammate", 200), ("outsider", 404), ("admin", 200), ("anonymous", 401)]
)
def test_detail_by_role(cast, api_as, alices, who, status):
    resp = api_as(cast[who]).get(f"{URL}{alices.pk}/")
    assert resp.status_code == status
    assert set(resp.json()) >= ({"id", "gpus", "status"} if status == 200 else {"code", "detail", "fields"})


@pytest.mark.parametrize(
    "who,status", [("owner", 201), ("teammate", 201), ("outsider", 403), ("admin", 201), ("anonymous", 401)]
)
def test_create_for_vision_by_role(cast, api_as, fleet, vision, who, status):
    start, end = slot()
    resp = api_as(cast[who]).post(URL, book_body("vision", start=start, end=end), format="json")
    assert resp.status_code == status
    assert Reservation.objects.count() == (1 if status == 201 else 0)


@pytest.mark.parametrize(
    "who,status",
    [("owner", 200), ("teammate", 403), ("outsider", 404), ("admin", 200), ("anonymous", 401)],
)
def test_cancel_by_role(cast, api_as, alices, who, status):
    """The booker, the team's managers and admins may end a reservation; other members may not."""
    resp = api_as(cast[who]).delete(f"{URL}{alices.pk}/")
    assert resp.status_code == status
    alices.refresh_from_db()
    assert alices.status == (ReservationStatus.CANCELLED if status == 200 else ReservationStatus.BOOKED)


def test_manager_may_cancel_a_members_booking(alice, bob, api_as, vision, fleet):
    r = _book(bob, vision, gpus=["GPU-big-1"])
    assert api_as(alice).delete(f"{URL}{r.pk}/").status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/availability/", "/api/v1/booking/timeline/"])
@pytest.mark.parametrize("who,status", [("owner", 200), ("outsider", 200), ("admin", 200), ("anonymous", 401)])
def test_fleet_wide_reads_by_role(cast, api_as, fleet, path, who, status):
    start, end = slot()
    resp = api_as(cast[who]).get(path, {"start": start.isoformat(), "end": end.isoformat()})
    assert resp.status_code == status


def test_timeline_shows_other_teams_only_by_name(charlie, alice, api_as, alices):
    start, end = slot(hours=24)
    params = {"start": (start - timedelta(hours=12)).isoformat(), "end": end.isoformat()}
    theirs = api_as(charlie).get("/api/v1/booking/timeline/", params).json()
    [slot_] = theirs["slots"]
    assert slot_["team"] == "vision" and slot_["mine"] is False
    assert "user" not in slot_ and "note" not in slot_ and "reservation_id" not in slot_
    assert "secret vision note" not in str(theirs)
    mine = api_as(alice).get("/api/v1/booking/timeline/", params).json()
    assert mine["slots"][0]["note"] == "secret vision note" and mine["slots"][0]["user"] == "alice"


def test_availability_counts_per_model_and_node(alice, api_as, alices):
    start, end = slot()
    body = api_as(alice).get("/api/v1/availability/", {"start": start.isoformat(), "end": end.isoformat()}).json()
    models = {m["model"]: m for m in body["models"]}
    assert models["A100-80GB"] == {"model": "A100-80GB", "total": 12, "free": 11, "max_free_on_one_node": 7}
    assert models["H100-80GB"]["free"] == 2
    nodes = {n["node"]: n for n in body["nodes"]}
    assert nodes["big"]["free"] == 7 and nodes["small"]["models"]["H100-80GB"] == {"total": 2, "free": 2}
    filtered = (
        api_as(alice)
        .get("/api/v1/availability/", {"start": start.isoformat(), "end": end.isoformat(), "model": "H100-80GB"})
        .json()
    )
    assert [m["model"] for m in filtered["models"]] == ["H100-80GB"]
    bad = api_as(alice).get("/api/v1/availability/", {"start": end.isoformat(), "end": start.isoformat()})
    assert bad.status_code == 400


def test_list_filters(alice, bob, api_as, vision, nlp, charlie, fleet):
    a = _book(alice, vision, gpus=["GPU-big-0"], days=1)
    b = _book(bob, vision, gpus=["GPU-small-4"], days=3)
    c = _book(alice, vision, gpus=["GPU-big-2"], days=5)
    services.reservation_end(user=alice, reservation_id=c.pk)
    client = api_as(alice)

    def ids(**params: Any) -> list[int]:
        resp = client.get(URL, params)
        assert resp.status_code == 200, resp.json()
        return [r["id"] for r in resp.json()["results"]]

    assert ids() == [a.pk, b.pk, c.pk]
    assert ids(team="vision") == [a.pk, b.pk, c.pk]
    assert ids(team="nlp") == []
    assert ids(gpu="GPU-small-4") == [b.pk]
    assert ids(model="H100-80GB") == [b.pk]
    assert ids(status="booked") == [a.pk, b.pk]
    assert ids(status="cancelled,released") == [c.pk]
    s2, _ = slot(days=2)
    assert ids(**{"from": s2.isoformat()}) == [b.pk, c.pk]
    assert ids(**{"to": s2.isoformat()}) == [a.pk]
    assert client.get(URL, {"status": "bogus"}).status_code == 400
    assert client.get(URL, {"from": "yesterday"}).status_code == 400


def test_the_early_filter_tells_an_early_end_from_a_normal_one(alice, vision, api_as, fleet):
    """A reservation that runs to its end is `released` by the tick, like one released early: `early` separates
    them by the end, for the Book page's list of early ends."""
    ran = _book(alice, vision, gpus=["GPU-big-1"], days=1)
    services.reservations_tick(now=ran.start)
    services.reservations_tick(now=ran.end)
    ran.refresh_from_db()
    assert (ran.status, ran.ended_at) == ("released", ran.booked_end)
    cancelled = _book(alice, vision, gpus=["GPU-big-0"], days=2)
    services.reservation_end(user=alice, reservation_id=cancelled.pk)
    now = timezone.now()
    slot_now = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    released = services.reservation_create(
        user=alice, team=vision, start=slot_now, end=slot_now + timedelta(hours=1), gpus=["GPU-big-2"]
    ).reservation
    services.reservation_end(user=alice, reservation_id=released.pk)
    booked = _book(alice, vision, gpus=["GPU-big-3"], days=3)
    client = api_as(alice)

    def ids(**params: Any) -> list[int]:
        resp = client.get(URL, params)
        assert resp.status_code == 200, resp.json()
        return [r["id"] for r in resp.json()["results"]]

    assert set(ids(status="released,cancelled")) == {ran.pk, cancelled.pk, released.pk}
    assert set(ids(early="true")) == {cancelled.pk, released.pk}
    assert set(ids(early="false")) == {ran.pk, booked.pk}
    bad = client.get(URL, {"early": "maybe"})
    assert bad.status_code == 400 and "early" in bad.json()["fields"], bad.json()


def test_book_page(alice, client: Client, fleet):
    assert client.get("/book/").status_code == 302
    client.force_login(alice)
    resp = client.get("/book/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'id="timeline"' in html and "portal/pages/book.js" in html and 'id="book-config"' in html


def test_ical_feed(alice, charlie, client: Client, alices, nlp, fleet):
    _book(charlie, nlp, gpus=["GPU-big-5"], note="nlp private")
    client.force_login(alice)
    resp = client.post("/book/calendar/regenerate/")
    assert resp.status_code == 200
    url = resp.context["feed_url"]
    assert "/book/calendar/" in url and url.endswith(".ics")
    path = url.split("testserver", 1)[1]
    anon = Client()
    feed = anon.get(path)
    assert feed.status_code == 200
    assert feed["Content-Type"].startswith("text/calendar")
    text = feed.content.decode()
    unfolded = text.replace("\r\n ", "")  # RFC 5545 line folding
    assert text.startswith("BEGIN:VCALENDAR\r\n") and text.rstrip().endswith("END:VCALENDAR")
    assert text.count("BEGIN:VEVENT") == 1
    assert f"UID:reservation-{alices.pk}@" in unfolded and "secret vision note" in unfolded
    assert "nlp private" not in unfolded
    assert all(len(line.encode()) <= 75 for line in text.split("\r\n"))
    # A new URL stops the old one; the key is stored only as a hash.
    client.post("/book/calendar/regenerate/")
    assert anon.get(path).status_code == 404
    assert anon.get("/book/calendar/not-a-key.ics").status_code == 404
    from apps.booking.models import CalendarFeed

    assert path.rsplit("/", 1)[1][:-4] not in CalendarFeed.objects.get(user=alice).digest


def test_ical_regenerate_needs_login(client: Client, db):
    resp = client.post("/book/calendar/regenerate/")
    assert resp.status_code == 302 and "/accounts/login" in resp["Location"]
