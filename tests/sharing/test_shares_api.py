"""Admins split a GPU in shares through the API (`POST /api/v1/gpus/{uuid}/shares/`), as `manage.py gpu_shares`
does: the new shares are bookable at once; the change is refused while the GPU or a share of it is held (409) and
for a bad count or a GPU in MIG mode (400), with nothing changed; and a change racing 50 parallel quarter bookings
over HTTP either wins before them or is refused after them, never leaving a booking on a share that is gone.

Fleet (tests/sharing/conftest.py): GPU-mig-0 in MIG mode and the exclusive GPU-mig-1; GPU-shared-0 split in 4 and
the exclusive GPU-shared-1. A100-80GB at 2.80/h."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction

from apps.audit.models import AuditEvent
from apps.booking.models import Allocation
from apps.booking.services import allocations_create, gpu_shares_change
from apps.booking.services.locks import lock_model
from apps.core.errors import Conflict
from apps.fleet.models import Gpu
from tests.booking.conftest import slot
from tests.booking.test_concurrency import body, overlapping_pairs, race, start_server
from tests.conftest import LiveServer

SHARES = "/api/v1/gpus/{}/shares/"


def _live_shares(uuid: str) -> list[Gpu]:
    return list(Gpu.devices.filter(parent__uuid=uuid, kind="share", retired_at__isnull=True).order_by("index"))


@pytest.mark.django_db
def test_an_admin_splits_a_gpu_and_the_shares_are_bookable(api_as, admin, alice, sharing_fleet):
    response = api_as(admin).post(SHARES.format("GPU-shared-1"), {"shares": 3}, format="json")
    assert response.status_code == 200, response.json()
    data = response.json()
    assert (data["gpu"], data["node"], data["shares"]) == ("GPU-shared-1", "shared", 3)
    assert [d["share"] for d in data["share_devices"]] == ["0.333334", "0.333333", "0.333333"]
    assert [d["index"] for d in data["share_devices"]] == [0, 1, 2]
    assert AuditEvent.objects.filter(action="gpu.shares", data={"from": 1, "to": 3}).exists()
    listed = {g["uuid"]: g for g in api_as(alice).get("/api/v1/gpus/").json()["results"]}
    assert (listed["GPU-shared-1"]["shares"], listed["GPU-shared-1"]["shares_free"]) == (3, 3)
    start, end = slot(hours=2)
    third = api_as(alice).post(
        "/api/v1/reservations/",
        body("vision", start, end, gpu_share="0.333333", gpus=["GPU-shared-1"]),
        format="json",
    )
    assert third.status_code == 201, third.json()
    # Exclusive again is refused while the third is booked; after it is cancelled, the GPU is whole again.
    refused = api_as(admin).post(SHARES.format("GPU-shared-1"), {"shares": 1}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.json()
    assert len(_live_shares("GPU-shared-1")) == 3
    assert api_as(alice).delete(f"/api/v1/reservations/{third.json()['id']}/").status_code == 200
    whole = api_as(admin).post(SHARES.format("GPU-shared-1"), {"shares": 1}, format="json")
    assert whole.status_code == 200 and whole.json()["share_devices"] == [], whole.json()
    assert Gpu.objects.get(uuid="GPU-shared-1").shares == 1 and _live_shares("GPU-shared-1") == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("uuid", "payload", "status", "field"),
    [
        ("GPU-shared-1", {"shares": 0}, 400, None),
        ("GPU-shared-1", {"shares": 17}, 400, "shares"),
        ("GPU-shared-1", {"shares": "two"}, 400, "shares"),
        ("GPU-shared-1", {"shares": True}, 400, "shares"),
        ("GPU-shared-1", {}, 400, "shares"),
        ("GPU-mig-0", {"shares": 4}, 400, "shares"),
        ("GPU-nope", {"shares": 2}, 404, None),
        ("GPU-shared-0/share-1", {"shares": 2}, 404, None),  # a share is not a GPU to split
    ],
)
def test_bad_requests_change_nothing(api_as, admin, sharing_fleet, uuid, payload, status, field):
    before = sorted(Gpu.devices.values_list("uuid", "shares", "retired_at"))
    response = api_as(admin).post(SHARES.format(uuid), payload, format="json")
    assert response.status_code == status, response.json()
    assert response.json()["detail"]
    if field is not None:
        assert field in response.json()["fields"], response.json()
    assert sorted(Gpu.devices.values_list("uuid", "shares", "retired_at")) == before


@pytest.mark.django_db
def test_only_admins_split_gpus(api_as, alice, admin, make_token, sharing_fleet):
    assert api_as(alice).post(SHARES.format("GPU-shared-1"), {"shares": 2}, format="json").status_code == 403
    assert api_as(None).post(SHARES.format("GPU-shared-1"), {"shares": 2}, format="json").status_code == 401
    read_only = make_token(admin, ["read"])
    client = api_as(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {read_only}")
    assert client.post(SHARES.format("GPU-shared-1"), {"shares": 2}, format="json").status_code == 403
    assert Gpu.objects.get(uuid="GPU-shared-1").shares == 1


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("split_to", [2, 1])
def test_a_change_racing_quarter_bookings_never_strands_one(
    alice, bob, admin, make_token, sharing_fleet, racing_portal, split_to
):
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    admin_token = make_token(admin, ["read", "admin"])
    start, end = slot(hours=2)
    url = racing_portal.url

    def request(i: int) -> tuple[str, str, dict[str, Any] | None, str]:
        if i == 25:
            return ("POST", url + SHARES.format("GPU-shared-0"), {"shares": split_to}, admin_token)
        payload = body("vision", start, end, gpu_share=0.25, gpus=["GPU-shared-0"])
        return ("POST", url + "/api/v1/reservations/", payload, tokens[i % 2])

    responses = race(50, request)
    change = responses[25]
    booked = Counter(r.status_code for i, r in enumerate(responses) if i != 25)
    held = Allocation.objects.filter(active=True)
    assert all(a.gpu.retired_at is None for a in held)  # nothing on a share that is gone
    assert overlapping_pairs() == 0
    if change.status_code == 200:
        # The change went first: the GPU is no longer split in quarters, so every quarter is refused.
        assert held.count() == 0 and booked[201] == 0, booked
        assert len(_live_shares("GPU-shared-0")) == (0 if split_to == 1 else 2)
    else:
        # A quarter went first: the change is refused, the four quarters are booked.
        assert change.status_code == 409 and change.json()["code"] == "conflict", change.json()
        assert booked[201] == 4 and held.count() == 4, booked
        assert {a.gpu.capacity for a in held} == {Decimal("0.250000")}
        assert len(_live_shares("GPU-shared-0")) == 4
    assert set(booked) <= {201, 400, 409}, booked


@pytest.mark.django_db(transaction=True)
def test_a_change_waits_for_a_booking_in_flight_and_then_sees_it(alice, vision, sharing_fleet):
    """A booking of a share takes the model's placement lock, reads the layout and writes; a change that came in
    between must wait for it and then be refused, not retire the share under it."""
    share = _live_shares("GPU-shared-0")[0]
    placed, release = threading.Event(), threading.Event()
    start, end = slot(hours=1)
    outcome: dict[str, Any] = {}

    def booking() -> None:
        try:
            with transaction.atomic():
                lock_model(share.model_id)  # as place_parts_locked does, before it reads the live shares
                placed.set()
                release.wait(timeout=30)
                allocations_create(gpus=[share], team=vision, user=alice, start=start, end=end, kind="job", job_id=1)
        finally:
            connection.close()

    def change() -> None:
        try:
            gpu_shares_change(actor=None, gpu_uuid="GPU-shared-0", shares=2)
            outcome["change"] = "applied"
        except Conflict:
            outcome["change"] = "refused"
        finally:
            connection.close()

    booker = threading.Thread(target=booking)
    booker.start()
    assert placed.wait(timeout=30)
    changer = threading.Thread(target=change)
    changer.start()
    changer.join(timeout=2)
    assert changer.is_alive()  # waiting for the booking's lock
    release.set()
    booker.join(timeout=30)
    changer.join(timeout=30)
    assert outcome == {"change": "refused"}
    held = Allocation.objects.get(active=True)
    assert held.gpu_id == share.pk and Gpu.devices.get(pk=share.pk).retired_at is None


@pytest.mark.django_db
def test_a_booking_that_read_the_gpu_before_it_was_split_is_refused(alice, vision, sharing_fleet, monkeypatch):
    """The GPU was exclusive when the booking read it and split before the booking wrote: the write finds the
    new layout under the GPU's lock and refuses (409), writing nothing."""
    from apps.booking.services import reservations

    def read_then_split(explicit: list[Any], start: Any, end: Any) -> list[Any]:
        gpu_shares_change(actor=None, gpu_uuid="GPU-shared-1", shares=2)  # an admin, just after the read
        return explicit

    monkeypatch.setattr(reservations, "whole_gpus", read_then_split)
    start, end = slot(hours=1)
    with pytest.raises(Conflict) as refused:
        reservations.reservation_create(user=alice, team=vision, start=start, end=end, gpus=["GPU-shared-1"])
    assert "layout of these GPUs changed" in refused.value.detail
    assert refused.value.extra == {"conflicts": [], "layout_changed": True}
    assert not Allocation.objects.exists()
    assert not reservations.Reservation.objects.exists()
