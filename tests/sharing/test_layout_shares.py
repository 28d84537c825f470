"""Shares and whole GPUs under a layout change: a share of a GPU that enters MIG mode moves to a share of the same
size of a GPU split the same way (or ends with "layout"); the shares of one GPU a booking holds move together (a
half never comes back as two quarters of two GPUs); a whole GPU, held exclusively or through every share of a split
one, moves to an exclusive GPU or to every share of a split one, and the quota hold stays the same. Registrations go
through the real service with the simulated backend's reports; splits through the admins' service; bookings
through the API."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.db import connection
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Allocation, QuotaHold, Reservation, ReservationStatus
from apps.booking.services import gpu_shares_change, reservations_rehome_stranded, reservations_tick
from apps.fleet.models import Node
from tests.booking.conftest import slot
from tests.booking.test_concurrency import body as race_body
from tests.booking.test_concurrency import overlapping_pairs, race, start_server
from tests.conftest import LiveServer
from tests.factories import GpuModelFactory, NodeFactory
from tests.sharing.test_layout_strands import SEVEN, URL, book, devices, register

pytestmark = pytest.mark.django_db

THREE = ["A100-80GB", "A100-80GB", "A100-80GB"]


@pytest.fixture
def gpus(db: Any) -> list[str]:
    """node-s with three A100s (uuids in index order); none split yet."""
    GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    return [g.uuid for g in register(NodeFactory(name="node-s"), THREE)]


def split(uuid: str, shares: int = 4) -> list[str]:
    return [s.uuid for s in gpu_shares_change(actor=None, gpu_uuid=uuid, shares=shares)[1]]


def into_mig() -> None:
    """GPU 0 of node-s enters MIG mode (an admin ran mig-parted); the other two stay as they are."""
    register(Node.objects.get(name="node-s"), [SEVEN, "A100-80GB", "A100-80GB"])


def parents(reservation_id: int) -> list[str]:
    return [d.parent.uuid if d.parent else d.uuid for d in devices(reservation_id)]


def test_a_share_of_a_gpu_that_enters_mig_mode_moves_to_a_share_of_the_same_size_or_ends(
    api_as, alice, bob, gpus, django_capture_on_commit_callbacks
):
    g0, g1, _ = gpus
    split(g0)
    split(g1)
    client = api_as(alice)
    first = book(client, gpus=[g0], gpu_share=0.25)
    second = book(client, gpus=[g0], gpu_share=0.25)
    for _ in range(3):  # three of g1's four shares are held in the same window
        book(api_as(bob), gpus=[g1], gpu_share=0.25)
    with django_capture_on_commit_callbacks(execute=True):
        into_mig()
    (moved,) = devices(first["id"])
    assert moved.kind == "share" and moved.parent.uuid == g1 and moved.capacity == Decimal("0.25")
    assert Reservation.objects.get(pk=first["id"]).status == ReservationStatus.BOOKED
    ended = Reservation.objects.get(pk=second["id"])
    assert (ended.status, ended.released_reason) == (ReservationStatus.CANCELLED, "layout")
    # Nothing holds a share of the GPU in MIG mode any more: its instances are all there is to book.
    assert not Allocation.objects.filter(active=True, gpu__parent__uuid=g0, gpu__kind="share").exists()


def test_a_half_moves_as_two_shares_of_one_gpu(api_as, alice, bob, gpus, django_capture_on_commit_callbacks):
    g0, g1, g2 = gpus
    split(g0)
    split(g1)
    split(g2)
    for _ in range(3):  # g1 has one share free: the half must not take it and one of g2's
        book(api_as(bob), gpus=[g1], gpu_share=0.25)
    half = book(api_as(alice), gpus=[g0], gpu_share=0.5)
    hold = QuotaHold.objects.get(reservation_id=half["id"])
    with django_capture_on_commit_callbacks(execute=True):
        into_mig()
    assert parents(half["id"]) == [g2, g2]
    assert sum(d.capacity for d in devices(half["id"])) == Decimal("0.5")
    after = QuotaHold.objects.get(pk=hold.pk)
    assert (after.gpus, after.hourly_rate) == (hold.gpus, hold.hourly_rate)


def test_a_whole_booking_held_through_every_share_moves_as_one_exclusive_gpu(
    api_as, alice, gpus, django_capture_on_commit_callbacks
):
    g0, g1, _ = gpus
    shares = split(g0)
    whole = book(api_as(alice), gpus=[g0])
    assert sorted(d.uuid for d in devices(whole["id"])) == sorted(shares)
    hold = QuotaHold.objects.get(reservation_id=whole["id"])
    with django_capture_on_commit_callbacks(execute=True):
        into_mig()
    assert [d.uuid for d in devices(whole["id"])] == [g1]  # one GPU, not four quarters of four
    rows = Allocation.objects.filter(reservation_id=whole["id"])
    assert rows.filter(active=False, gpu__uuid__in=shares).count() == 4  # not started: they leave the bill
    after = QuotaHold.objects.get(pk=hold.pk)
    assert (after.gpus, after.hourly_rate, after.active) == (hold.gpus, hold.hourly_rate, True)
    move = AuditEvent.objects.get(action="reservation.move", target_id=str(whole["id"]))
    assert move.data == {"moves": dict.fromkeys(shares, g1), "reason": "layout"}
    assert api_as(alice).get(f"{URL}{whole['id']}/").json()["gpus"][0]["uuid"] == g1


def test_a_running_whole_booking_moves_to_every_share_of_a_split_gpu_when_no_exclusive_one_is_free(
    api_as, alice, bob, gpus, django_capture_on_commit_callbacks
):
    g0, g1, g2 = gpus
    shares = split(g1)
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 15)
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat(), "team": "vision"}
    mine = api_as(alice).post(URL, {**window, "gpus": [g0]}, "json").json()
    assert api_as(bob).post(URL, {**window, "gpus": [g2]}, "json").status_code == 201  # the other exclusive one
    reservations_tick()
    hold = QuotaHold.objects.get(reservation_id=mine["id"])
    with django_capture_on_commit_callbacks(execute=True):
        into_mig()
    rows = list(Allocation.objects.filter(reservation_id=mine["id"], active=True).select_related("gpu"))
    used = [r for r in rows if r.gpu.uuid == g0]
    rest = sorted((r for r in rows if r.gpu.uuid != g0), key=lambda r: r.gpu.index)
    assert len(used) == 1 and [r.gpu.uuid for r in rest] == shares
    assert all(r.start == used[0].end and r.end == start + timedelta(hours=2) for r in rest)
    assert sum(r.gpu.capacity for r in rest) == 1
    assert Reservation.objects.get(pk=mine["id"]).status == ReservationStatus.ACTIVE
    after = QuotaHold.objects.get(pk=hold.pk)
    assert (after.gpus, after.hourly_rate) == (hold.gpus, hold.hourly_rate)
    move = AuditEvent.objects.get(action="reservation.move", target_id=str(mine["id"]))
    assert move.data["moves"] == {g0: g1}
    # The split GPU is held whole now: no share of it can be booked in the window.
    late = {**window, "start": (start + timedelta(hours=1)).isoformat(), "gpus": [g1], "gpu_share": 0.25}
    assert api_as(bob).post(URL, late, "json").status_code == 409


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_whole_booking_moving_onto_shares_races_thirty_share_bookings_and_nothing_is_oversubscribed(
    alice, bob, make_token, racing_portal
):
    """Alice holds the exclusive GPU 0 of node-s; GPUs 1 and 2 are split in 4. Thirty quarter-GPU bookings over
    HTTP race GPU 0 entering MIG mode, which moves Alice's booking onto every share of one split GPU (or ends it,
    if the race left none whole). Whatever the order: no share is held twice, Alice holds four shares of one GPU
    or was cancelled for the layout, and every 201 holds a quarter nobody else does."""
    GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    node = NodeFactory(name="node-s")
    g0, g1, g2 = (g.uuid for g in register(node, THREE))
    split(g1)
    split(g2)
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, end = slot(hours=2)
    url = racing_portal.url + URL
    headers = {"Authorization": f"Bearer {tokens[0]}"}
    mine = requests.post(url, json=race_body("vision", start, end, gpus=[g0]), headers=headers, timeout=60).json()

    def change() -> None:
        try:  # mid-race: once the first quarters are written
            deadline = time.monotonic() + 60
            while Allocation.objects.filter(gpu__kind="share", active=True).count() < 2:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            register(node, [SEVEN, "A100-80GB", "A100-80GB"])
            reservations_rehome_stranded()  # what the registration's after-commit step does
        finally:
            connection.close()

    changer = threading.Thread(target=change)
    changer.start()
    responses = race(30, lambda i: ("POST", url, race_body("vision", start, end, gpu_share=0.25), tokens[i % 2]))
    changer.join(timeout=60)
    assert not changer.is_alive()
    assert {r.status_code for r in responses} <= {201, 409}, [r.json() for r in responses if r.status_code >= 500]
    reservations_rehome_stranded()
    assert overlapping_pairs() == 0
    alices = Reservation.objects.get(pk=mine["id"])
    held = list(Allocation.objects.filter(reservation=alices, active=True).select_related("gpu"))
    if alices.status == ReservationStatus.BOOKED:
        assert len(held) == 4 and len({a.gpu.parent_id for a in held}) == 1
        assert sum(a.gpu.capacity for a in held) == 1
    else:
        assert (alices.status, alices.released_reason) == (ReservationStatus.CANCELLED, "layout")
    won = [r.json()["id"] for r in responses if r.status_code == 201]
    quarters = Allocation.objects.filter(reservation_id__in=won, active=True, gpu__kind="share")
    # A booking that picked a share the move took a moment later is refused (409) even if another was still free,
    # so the winners are at most what the move left.
    assert quarters.count() == len(won) <= 8 - (4 if alices.status == ReservationStatus.BOOKED else 0)
