"""The waitlist for slices of GPUs: a member refused a MIG instance or a share waits for that slice (not for whole
GPUs); a freed slice is booked for them or they are told, and only once enough of it is free; a slice the model's
GPUs do not give is refused at once with the usual error shape, nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from apps.booking import services as booking
from apps.booking.models import Reservation
from apps.efficiency.models import WaitlistEntry, WaitState
from apps.efficiency.waitlist import waitlist_join, waitlist_serve
from apps.events.models import OutboxEvent
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/waitlist/"
RESERVATIONS = "/api/v1/reservations/"


def _window() -> dict[str, str]:
    start, end = slot(days=1, hours=2)
    return {"team": "vision", "start": start.isoformat(), "end": end.isoformat()}


def _book(user: Any, **part: Any) -> Reservation:
    start, end = slot(days=1, hours=2)
    team = user.memberships.first().team
    return booking.reservation_create(
        user=user, team=team, start=start, end=end, gpu_model="A100-80GB", **part
    ).reservation


def test_a_member_refused_an_instance_waits_for_one_and_gets_it(api_as, alice, bob, sharing_fleet):
    _book(alice, mig_profile="1g.10gb", gpu_count=6)
    last = _book(alice, mig_profile="1g.10gb", gpu_count=1)
    refused = api_as(bob).post(RESERVATIONS, {**_window(), "gpu_model": "A100-80GB", "mig_profile": "1g.10gb",
                                              "gpu_count": 1}, format="json")  # fmt: skip
    assert refused.status_code == 409 and refused.json()["free"] == 0
    resp = api_as(bob).post(
        URL,
        {**_window(), "gpu_model": "A100-80GB", "mig_profile": "1g.10gb", "gpu_count": 1, "auto_book": True},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    assert (resp.json()["mig_profile"], resp.json()["gpu_share"], resp.json()["gpu_count"]) == ("1g.10gb", None, 1)
    # Whole A100s are free on both nodes all along: an entry for an instance is not served by them.
    assert waitlist_serve() == {"booked": [], "notified": []}

    booking.reservation_end(user=alice, reservation_id=last.pk)
    entry_id = resp.json()["id"]
    assert waitlist_serve()["booked"] == [entry_id]
    booked = Reservation.objects.get(pk=WaitlistEntry.objects.get(pk=entry_id).reservation_id)
    (alloc,) = booked.allocations.select_related("gpu")
    assert booked.user == bob and alloc.gpu.kind == "mig" and alloc.gpu.mig_profile == "1g.10gb"
    assert WaitlistEntry.objects.get(pk=entry_id).state == WaitState.BOOKED
    assert waitlist_serve() == {"booked": [], "notified": []}  # once


def test_a_member_waiting_for_half_a_gpu_is_told_once_two_shares_are_free(alice, bob, sharing_fleet):
    quarter = _book(alice, gpu_share=0.25)
    three = _book(alice, gpu_share=0.75)
    start, end = slot(days=1, hours=2)
    entry = waitlist_join(
        user=bob, team=quarter.team, gpu_model="A100-80GB", gpu_count=1, gpu_share=0.5, start=start, end=end
    )
    booking.reservation_end(user=alice, reservation_id=quarter.pk)
    assert waitlist_serve()["notified"] == []  # one share of four free: not half a GPU
    booking.reservation_end(user=alice, reservation_id=three.pk)
    assert waitlist_serve()["notified"] == [entry.pk]
    event = OutboxEvent.objects.get(event_type="waitlist.available")
    assert event.user_id == bob.pk and event.data["gpu_share"] == "0.5" and "mig_profile" not in event.data
    assert event.data["free"] == 2  # the four shares of the split GPU make two halves
    # Told, not booked: bob books it himself.
    assert not Reservation.objects.filter(user=bob).exists()
    assert WaitlistEntry.objects.get(pk=entry.pk).state == WaitState.NOTIFIED


def test_a_member_told_of_instances_hears_how_many_are_free(alice, bob, sharing_fleet):
    first = _book(alice, mig_profile="1g.10gb", gpu_count=3)
    _book(alice, mig_profile="1g.10gb", gpu_count=4)  # all seven held
    start, end = slot(days=1, hours=2)
    entry = waitlist_join(
        user=bob, team=first.team, gpu_model="A100-80GB", gpu_count=2, mig_profile="1g.10gb", start=start, end=end
    )
    assert waitlist_serve()["notified"] == []
    booking.reservation_end(user=alice, reservation_id=first.pk)
    assert waitlist_serve()["notified"] == [entry.pk]
    event = OutboxEvent.objects.get(event_type="waitlist.available")
    assert (event.data["mig_profile"], event.data["gpu_count"], event.data["free"]) == ("1g.10gb", 2, 3)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"mig_profile": "1g.10gb", "gpu_share": 0.25}, "gpu_share"),
        ({"mig_profile": "9g.99gb"}, "mig_profile"),
        ({"mig_profile": "1g.5gb"}, "mig_profile"),  # an A100-40GB profile: no instance of the A100-80GB has it
        ({"gpu_share": 0.3}, "gpu_share"),  # the split GPU has 4 shares
        ({"gpu_share": 0}, "gpu_share"),
        ({"gpu_share": 0.5, "gpu_count": 2}, "gpu_count"),
    ],
)
def test_a_slice_the_fleet_does_not_give_is_refused(api_as, bob, sharing_fleet, extra, field):
    resp = api_as(bob).post(URL, {**_window(), "gpu_model": "A100-80GB", "gpu_count": 1, **extra}, format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["fields"] and resp.json()["code"]
    assert not WaitlistEntry.objects.exists()
