"""The waitlist: a member refused for lack of GPUs joins it; a release nudges the serve task (over the broker); the
freed GPUs are booked for the oldest entry that asked for it, or its member is told (event); serving twice or
concurrently books once; members of other teams cannot see or cancel entries."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.booking import services as booking
from apps.booking.models import Reservation
from apps.core.errors import Conflict
from apps.core.redis import get_redis
from apps.efficiency.models import WaitlistEntry, WaitState
from apps.efficiency.waitlist import waitlist_join, waitlist_serve
from apps.events.models import OutboxEvent

URL = "/api/v1/waitlist/"


def _slot(hours: int = 2) -> tuple[Any, Any]:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    return start, start + timedelta(hours=hours)


def _hold_both_h100(alice: Any) -> Reservation:
    start, end = _slot()
    r = booking.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, gpu_model="H100-80GB", gpu_count=2
    ).reservation
    booking.reservations_tick(now=timezone.now())
    return r


def _broker_tasks(queue: str) -> list[str]:
    out = []
    for raw in get_redis().lrange(queue, 0, -1):
        out.append(json.loads(raw)["headers"]["task"])
    return out


@pytest.mark.django_db
def test_refused_member_waits_and_gets_the_freed_gpu(api_as, alice, bob, fleet, django_capture_on_commit_callbacks):
    r = _hold_both_h100(alice)
    start, end = _slot()
    with pytest.raises(Conflict) as refused:
        booking.reservation_create(user=bob, team=r.team, start=start, end=end, gpu_model="H100-80GB", gpu_count=1)
    assert refused.value.extra["free"] == 0
    body = {"team": "vision", "gpu_model": "H100-80GB", "gpu_count": 1, "start": start.isoformat(),
            "end": end.isoformat(), "auto_book": True}  # fmt: skip
    resp = api_as(bob).post(URL, body, format="json")
    assert resp.status_code == 201 and resp.json()["state"] == "waiting"
    entry_id = resp.json()["id"]
    assert waitlist_serve() == {"booked": [], "notified": []}  # nothing free yet

    get_redis().delete("portal")
    with django_capture_on_commit_callbacks(execute=True):
        booking.reservation_end(user=alice, reservation_id=r.pk)
    assert "efficiency.waitlist_serve" in _broker_tasks("portal")  # the release nudged the waitlist at once

    assert waitlist_serve()["booked"] == [entry_id]
    entry = WaitlistEntry.objects.get(pk=entry_id)
    assert entry.state == WaitState.BOOKED
    booked = Reservation.objects.get(pk=entry.reservation_id)
    assert booked.user == bob and booked.booked_end == end and booked.gpu_count == 1
    assert waitlist_serve() == {"booked": [], "notified": []}  # once


@pytest.mark.django_db
def test_shortening_a_booking_offers_the_freed_time_at_once(alice, bob, fleet, django_capture_on_commit_callbacks):
    r = _hold_both_h100(alice)
    start, end = _slot()
    later = start + timedelta(hours=1)
    entry = waitlist_join(
        user=bob, team=r.team, gpu_model="H100-80GB", gpu_count=2, start=later, end=end, auto_book=True
    )
    assert waitlist_serve() == {"booked": [], "notified": []}  # alice holds both until `end`

    get_redis().delete("portal")
    with django_capture_on_commit_callbacks(execute=True):
        booking.reservation_change_end(user=alice, reservation_id=r.pk, end=later)
    assert "efficiency.waitlist_serve" in _broker_tasks("portal")  # nudged now, not at the next idle scan

    assert waitlist_serve()["booked"] == [entry.pk]
    booked = Reservation.objects.get(pk=WaitlistEntry.objects.get(pk=entry.pk).reservation_id)
    assert booked.user == bob and booked.start == later and booked.booked_end == end and booked.gpu_count == 2

    get_redis().delete("portal")
    with django_capture_on_commit_callbacks(execute=True):
        booking.reservation_change_end(user=bob, reservation_id=booked.pk, end=end + timedelta(hours=1))
    # An extension frees nothing. (Its own event's dispatch nudge may be on the queue: another thread sends it.)
    assert "efficiency.waitlist_serve" not in _broker_tasks("portal")


@pytest.mark.django_db
def test_member_who_asked_to_be_told_is_notified(alice, bob, fleet):
    r = _hold_both_h100(alice)
    start, end = _slot()
    entry = waitlist_join(user=bob, team=r.team, gpu_model="H100-80GB", gpu_count=2, start=start, end=end)
    booking.reservation_end(user=alice, reservation_id=r.pk)
    assert waitlist_serve()["notified"] == [entry.pk]
    event = OutboxEvent.objects.get(event_type="waitlist.available")
    assert event.user_id == bob.pk and event.data["free"] == 2
    assert not Reservation.objects.filter(user=bob).exists()


@pytest.mark.django_db
def test_outsiders_neither_see_nor_cancel(api_as, bob, charlie, fleet):
    start, end = _slot()
    entry = waitlist_join(user=bob, team=bob.memberships.first().team, gpu_model="H100-80GB", gpu_count=1,
                          start=start, end=end)  # fmt: skip
    assert api_as(charlie).get(URL).json()["results"] == []
    assert api_as(charlie).delete(f"{URL}{entry.pk}/").status_code == 404
    resp = api_as(charlie).post(URL, {"team": "vision", "gpu_model": "H100-80GB", "gpu_count": 1,
                                      "start": start.isoformat(), "end": end.isoformat()}, format="json")  # fmt: skip
    assert resp.status_code == 404
    assert api_as(bob).delete(f"{URL}{entry.pk}/").json()["state"] == "cancelled"
    assert api_as(bob).delete(f"{URL}{entry.pk}/").status_code == 409


@pytest.mark.django_db(transaction=True)
def test_concurrent_serves_book_once(alice, bob, fleet):
    r = _hold_both_h100(alice)
    start, end = _slot()
    entry = waitlist_join(user=bob, team=r.team, gpu_model="H100-80GB", gpu_count=1, start=start, end=end,
                          auto_book=True)  # fmt: skip
    booking.reservation_end(user=alice, reservation_id=r.pk)
    results: list[dict[str, list[int]]] = []
    barrier = threading.Barrier(2)

    def serve() -> None:
        try:
            barrier.wait()
            results.append(waitlist_serve())
        finally:
            connection.close()

    threads = [threading.Thread(target=serve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(x["booked"]) for x in results) == [0, 1]
    assert Reservation.objects.filter(user=bob).count() == 1
    assert WaitlistEntry.objects.get(pk=entry.pk).state == WaitState.BOOKED
