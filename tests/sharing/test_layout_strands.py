"""A node's MIG layout changes under bookings: each booking of a device the new layout no longer gives is moved to
an equal free device (new instance uuids after mig-parted made them again, another GPU, another node), or ended
with `released_reason` "layout"; the scheduler's layout version moves with the change; the lifecycle tick catches
what a registration's own pass did not. Registrations go through the real service with the simulated backend's
reports (NVIDIA's profiles); bookings through the API."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.db import connection, transaction
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Allocation, QuotaHold, Reservation, ReservationStatus
from apps.booking.services import reservations_rehome_stranded, reservations_tick
from apps.booking.tasks import lifecycle_tick
from apps.events.models import OutboxEvent
from apps.fleet import services
from apps.fleet.devices import mig_layout_apply
from apps.fleet.messages import check_registration
from apps.fleet.models import Gpu, Node
from apps.jobs.models import SchedulerState
from tests.booking.conftest import slot
from tests.booking.test_concurrency import body as race_body
from tests.booking.test_concurrency import overlapping_pairs, race, start_server
from tests.conftest import LiveServer
from tests.factories import GpuModelFactory, NodeFactory
from workers.gpu.base import GpuInfo
from workers.gpu.simulated import SimulatedBackend

URL = "/api/v1/reservations/"
SEVEN = "A100-80GB:mig=1g.10gb*7"


def register(node: Any, specs: list[str], *, made: int = 1) -> list[GpuInfo]:
    """Register `node` with what the simulated backend finds for `specs`. `made` counts the times the instances
    were created: on a real GPU each creation gives them new uuids (the GPUs keep theirs)."""
    gpus = [
        dataclasses.replace(
            g, mig_devices=tuple(dataclasses.replace(d, uuid=f"{d.uuid}-{made}") for d in g.mig_devices)
        )
        for g in SimulatedBackend(node.name, specs).discover()
    ]
    payload = {"node": node.name, "token": "x", "ts": None, "gpus": [g.to_dict() for g in gpus], "backend": "simulated"}
    services.node_register(node_id=node.pk, gpus=check_registration(payload).gpus)
    return gpus


def book(client: Any, *, days: int = 1, **extra: Any) -> dict[str, Any]:
    start, end = slot(days=days, hours=2)
    resp = client.post(URL, {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}, "json")
    assert resp.status_code == 201, resp.json()
    return resp.json()


def devices(reservation_id: int) -> list[Gpu]:
    rows = Allocation.objects.filter(reservation_id=reservation_id, active=True).select_related("gpu")
    return [a.gpu for a in rows.order_by("start", "gpu_id")]


def layout_version() -> int:
    return SchedulerState.objects.filter(pk=1).values_list("layout_version", flat=True).first() or 0


@pytest.fixture
def a100(db: Any) -> Any:
    return GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))


@pytest.fixture
def node_a(a100: Any) -> Any:
    node = NodeFactory(name="node-a")
    register(node, [SEVEN, "A100-80GB"])
    return node


@pytest.mark.django_db
def test_new_instance_uuids_take_the_bookings_over(api_as, alice, node_a, django_capture_on_commit_callbacks):
    """mig-parted made the same layout again (a reboot): the instances have new uuids; each booking moves to one of
    the new instances of its GPU, and keeps its window, status and price."""
    client = api_as(alice)
    first = book(client, mig_profile="1g.10gb")
    second = book(client, mig_profile="1g.10gb")
    old = {first["gpus"][0]["uuid"], second["gpus"][0]["uuid"]}
    version = layout_version()
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, [SEVEN, "A100-80GB"], made=2)
    assert layout_version() == version + 1
    new = {d.uuid for r in (first, second) for d in devices(r["id"])}
    assert len(new) == 2 and not new & old
    live = set(Gpu.devices.filter(kind="mig", retired_at__isnull=True).values_list("uuid", flat=True))
    assert new <= live
    for r in (first, second):
        reservation = Reservation.objects.get(pk=r["id"])
        assert reservation.status == ReservationStatus.BOOKED and reservation.released_reason == ""
        (gpu,) = devices(r["id"])
        assert gpu.mig_profile == "1g.10gb" and gpu.parent.uuid == first["gpus"][0]["parent"]
        assert client.get(f"{URL}{r['id']}/").json()["gpus"][0]["uuid"] == gpu.uuid
        assert AuditEvent.objects.filter(action="reservation.move", target_id=str(r["id"])).exists()
    # The same report again moves nothing and does not touch the scheduler's version.
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, [SEVEN, "A100-80GB"], made=2)
    assert layout_version() == version + 1
    assert {d.uuid for r in (first, second) for d in devices(r["id"])} == new


@pytest.mark.django_db
def test_the_holder_is_told_after_commit(api_as, alice, node_a, django_capture_on_commit_callbacks):
    """booking.hooks' reservation-rehomed handlers hear each move and each end, after commit; the efficiency app's
    (the banner on every page) is registered when the apps load."""
    from apps.booking import hooks
    from apps.efficiency.services import tell_rehomed

    assert tell_rehomed in hooks._rehomed.handlers
    heard: list[hooks.ReservationRehomed] = []
    hooks.register_reservation_rehomed(heard.append)
    try:
        client = api_as(alice)
        first, second = book(client, mig_profile="1g.10gb"), book(client, mig_profile="1g.10gb")
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            register(node_a, ["A100-80GB:mig=1g.10gb+3g.40gb", "A100-80GB"], made=2)
            assert heard == []  # not before the commit
        assert len(callbacks) >= 2
    finally:
        hooks.unregister_reservation_rehomed(heard.append)
    moved, ended = sorted(heard, key=lambda e: e.ended)
    assert moved.reservation_id == first["id"] and not moved.ended and moved.user_id == alice.pk
    assert list(moved.moved) == [first["gpus"][0]["uuid"]]
    assert ended.reservation_id == second["id"] and ended.ended and "no free device" in ended.message
    # Webhooks and mail hear the move too (the end is a `reservation.released` with the reason).
    from apps.events.models import OutboxEvent

    (event,) = OutboxEvent.objects.filter(event_type="reservation.moved")
    assert event.subject == f"reservations/{first['id']}" and event.user_id == alice.pk
    assert event.data["reason"] == "layout" and event.data["moves"] == moved.moved and event.data["message"]
    assert event.data["status"] == "booked"
    released = OutboxEvent.objects.get(event_type="reservation.released", subject=f"reservations/{second['id']}")
    assert released.data["reason"] == "layout"
    # Calendars fetch the moved one again (the iCal feed's Last-Modified and DTSTAMP).
    from apps.booking.models import Reservation

    assert Reservation.objects.get(pk=first["id"]).changed_at is not None


@pytest.mark.django_db
def test_a_repartition_that_drops_the_profile_ends_the_booking_for_the_layout(
    api_as, alice, node_a, django_capture_on_commit_callbacks
):
    client = api_as(alice)
    mine = book(client, mig_profile="1g.10gb")
    hold_before = QuotaHold.objects.get(reservation_id=mine["id"])
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, ["A100-80GB:mig=3g.40gb+4g.40gb", "A100-80GB"])
    reservation = Reservation.objects.get(pk=mine["id"])
    assert reservation.status == ReservationStatus.CANCELLED
    assert reservation.released_reason == "layout"
    assert not Allocation.objects.filter(reservation_id=mine["id"], active=True).exists()
    assert hold_before.active and not QuotaHold.objects.get(pk=hold_before.pk).active
    event = OutboxEvent.objects.filter(event_type="reservation.released", subject=f"reservations/{mine['id']}").get()
    assert event.data["status"] == "cancelled" and event.data["reason"] == "layout"
    assert "no free device gives a 1g.10gb instance (A100-80GB)" in event.data["message"]
    shown = client.get(f"{URL}{mine['id']}/").json()
    assert shown["status"] == "cancelled" and shown["released_reason"] == "layout"
    # The GPU's new instances are free for new bookings.
    assert book(client, mig_profile="3g.40gb")["gpus"][0]["parent"] == mine["gpus"][0]["parent"]


@pytest.mark.django_db
def test_a_booking_moves_to_another_node_when_its_own_has_no_equal_instance(
    api_as, alice, a100, node_a, django_capture_on_commit_callbacks
):
    node_b = NodeFactory(name="node-b")
    register(node_b, [SEVEN], made=5)
    client = api_as(alice)
    mine = [book(client, gpus=[g.uuid], mig_profile="1g.10gb") for g in Gpu.devices.filter(parent__node=node_a)[:2]]
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, ["A100-80GB", "A100-80GB"])  # MIG mode off on node-a
    for r in mine:
        (gpu,) = devices(r["id"])
        assert gpu.node_id == node_b.pk and gpu.mig_profile == "1g.10gb" and gpu.retired_at is None
        assert Reservation.objects.get(pk=r["id"]).status == ReservationStatus.BOOKED
    assert len({d.pk for r in mine for d in devices(r["id"])}) == 2


@pytest.mark.django_db
def test_a_booking_does_not_move_into_another_pool(api_as, alice, a100, node_a, django_capture_on_commit_callbacks):
    """Another pool's GPUs are another scheduler's (a Slurm pool mirrors its own bookings): no move there."""
    from apps.fleet.models import Pool

    node_s = NodeFactory(name="node-s", pool=Pool.objects.create(name="cluster", backend="slurm"))
    register(node_s, [SEVEN])
    mine = book(api_as(alice), gpus=[Gpu.devices.filter(parent__node=node_a)[0].uuid], mig_profile="1g.10gb")
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, ["A100-80GB", "A100-80GB"])
    reservation = Reservation.objects.get(pk=mine["id"])
    assert reservation.status == ReservationStatus.CANCELLED and reservation.released_reason == "layout"


@pytest.mark.django_db
def test_a_whole_booking_of_a_gpu_that_enters_mig_mode_moves_to_an_exclusive_gpu_or_ends(
    api_as, alice, a100, django_capture_on_commit_callbacks
):
    node = NodeFactory(name="node-w")
    gpus = register(node, ["A100-80GB", "A100-80GB"])
    client = api_as(alice)
    first = book(client, gpus=[gpus[0].uuid])
    second = book(client, gpus=[gpus[0].uuid], days=2)
    blocker = book(client, gpus=[gpus[1].uuid], days=2)  # the other GPU is held on the second day
    with django_capture_on_commit_callbacks(execute=True):
        register(node, [SEVEN, "A100-80GB"])
    assert [d.uuid for d in devices(first["id"])] == [gpus[1].uuid]
    assert Reservation.objects.get(pk=second["id"]).status == ReservationStatus.CANCELLED
    assert Reservation.objects.get(pk=second["id"]).released_reason == "layout"
    event = OutboxEvent.objects.get(event_type="reservation.released", subject=f"reservations/{second['id']}")
    assert "no free device gives a whole GPU (A100-80GB)" in event.data["message"]
    assert [d.uuid for d in devices(blocker["id"])] == [gpus[1].uuid]
    # The GPU is booked by its instances now.
    assert book(client, mig_profile="1g.10gb", days=2)["gpus"][0]["parent"] == gpus[0].uuid


@pytest.mark.django_db
def test_a_running_booking_keeps_what_it_used_and_goes_on_on_the_new_instance(
    api_as, alice, node_a, sent, django_capture_on_commit_callbacks
):
    node_a.token_digest = "d" * 64  # so the agent is told about the holds
    node_a.save(update_fields=["token_digest"])
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 15)
    client = api_as(alice)
    resp = client.post(
        URL,
        {"team": "vision", "start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat(),
         "mig_profile": "1g.10gb"},
        "json",
    )  # fmt: skip
    assert resp.status_code == 201, resp.json()
    rid = resp.json()["id"]
    reservations_tick()
    assert Reservation.objects.get(pk=rid).status == ReservationStatus.ACTIVE
    old = resp.json()["gpus"][0]["uuid"]
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, [SEVEN, "A100-80GB"], made=3)
    rows = list(Allocation.objects.filter(reservation_id=rid).select_related("gpu").order_by("start"))
    assert [r.gpu.uuid == old for r in rows] == [True, False]
    used, rest = rows
    assert used.active and used.end == rest.start and rest.end == start + timedelta(hours=2)
    assert rest.gpu.retired_at is None and rest.gpu.mig_profile == "1g.10gb"
    assert Reservation.objects.get(pk=rid).status == ReservationStatus.ACTIVE
    assert any(h["gpu_uuid"] == rest.gpu.uuid for body in sent for h in body.get("holds", []))


@pytest.mark.django_db
def test_the_lifecycle_tick_moves_what_the_registration_did_not(api_as, alice, node_a):
    """A booking written while the layout changed (or a registration whose after-commit step did not run) is
    found by the tick: here the layout is changed without the guard, as such a booking would find it."""
    client = api_as(alice)
    mine = book(client, mig_profile="1g.10gb")
    parent = Gpu.objects.get(uuid=mine["gpus"][0]["parent"])
    fresh = [
        dataclasses.replace(d, uuid=f"{d.uuid}-9")
        for d in SimulatedBackend("node-a", [SEVEN]).discover()[0].mig_devices
    ]
    mig_layout_apply(gpu=parent, mig_mode=True, instances=fresh)
    assert devices(mine["id"])[0].retired_at is not None
    out = lifecycle_tick()
    assert out["rehomed"] == [mine["id"]] and out["ended_by_layout"] == []
    assert devices(mine["id"])[0].uuid in {d.uuid for d in fresh}
    assert reservations_rehome_stranded() == {"moved": [], "ended": []}


@pytest.mark.django_db(transaction=True)
def test_a_registration_that_changes_a_layout_waits_for_a_scheduler_write(alice, a100):
    """The registration takes the scheduler's row before the node's and GPUs' rows (the order an admin's change of
    shares and the scheduler's write take), so it waits for a pass writing its starts instead of deadlocking."""
    node = NodeFactory(name="node-l")
    register(node, [SEVEN])
    SchedulerState.objects.get_or_create(pk=1)
    version = layout_version()
    done: dict[str, bool] = {}

    def reregister() -> None:
        try:
            register(node, [SEVEN], made=4)
            done["ok"] = True
        finally:
            connection.close()

    worker = threading.Thread(target=reregister)
    with transaction.atomic():  # a pass's write transaction: the scheduler's row first
        SchedulerState.objects.filter(pk=1).update(fence=1)
        worker.start()
        worker.join(timeout=2)
        assert worker.is_alive()
        # It waits before it has locked the node's rows: a writer holding the scheduler's row may still take them.
        with transaction.atomic():
            assert Node.objects.select_for_update(nowait=True).filter(pk=node.pk).count() == 1
            assert len(Gpu.devices.select_for_update(nowait=True).filter(node=node)) == 8
    worker.join(timeout=30)
    assert done == {"ok": True}
    assert layout_version() == version + 1
    # A registration that changes nothing (the agent's periodic one) does not wait for the scheduler.
    done.clear()
    again = threading.Thread(target=lambda: (register(node, [SEVEN], made=4), done.update(ok=True), connection.close()))
    with transaction.atomic():
        SchedulerState.objects.filter(pk=1).update(fence=2)
        again.start()
        again.join(timeout=30)
        assert done == {"ok": True}


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_new_layout_racing_forty_bookings_never_oversubscribes_or_strands(
    alice, bob, make_token, a100, racing_portal
):
    """Four bookings hold 1g.10gb instances of node-a's GPU; forty more ask for one in the same window over HTTP
    while the node registers the instances made anew (new uuids). Whatever the order: no two bookings overlap on a
    device, nothing stays on a retired instance, and each of the four first bookings is moved or ended for the
    layout."""
    node = NodeFactory(name="node-a")
    register(node, [SEVEN])
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, end = slot(hours=2)
    url = racing_portal.url + URL
    first = [
        requests.post(url, json=race_body("vision", start, end, mig_profile="1g.10gb"), timeout=60,
                      headers={"Authorization": f"Bearer {tokens[0]}"}).json()["id"]
        for _ in range(4)
    ]  # fmt: skip

    def reregister() -> None:
        try:
            time.sleep(0.05)
            register(node, [SEVEN], made=2)
        finally:
            connection.close()

    changer = threading.Thread(target=reregister)
    changer.start()
    responses = race(
        40,
        lambda i: ("POST", url, race_body("vision", start, end, mig_profile="1g.10gb"), tokens[i % 2]),
    )
    changer.join(timeout=60)
    assert not changer.is_alive()
    assert {r.status_code for r in responses} <= {201, 409}, [r.json() for r in responses if r.status_code >= 500]
    lifecycle_tick()  # what a booking written during the change left behind
    assert overlapping_pairs() == 0
    held = Allocation.objects.filter(active=True, end__gt=timezone.now()).select_related("gpu")
    assert all(a.gpu.retired_at is None for a in held)
    assert held.count() <= 7
    for rid in first:
        reservation = Reservation.objects.get(pk=rid)
        assert reservation.status == ReservationStatus.BOOKED or (
            reservation.status == ReservationStatus.CANCELLED and reservation.released_reason == "layout"
        )
    booked = Reservation.objects.filter(status=ReservationStatus.BOOKED)
    assert booked.count() == held.count()


@pytest.mark.django_db
def test_a_change_the_first_read_missed_is_registered_guarded(
    api_as, alice, node_a, monkeypatch, django_capture_on_commit_callbacks
):
    """Another registration of the node changed the layout between this one's first read and its transaction: the
    change is found inside, and the registration is done again with the guard's locks, not without them."""
    mine = book(api_as(alice), mig_profile="1g.10gb")
    locks: list[str] = []
    monkeypatch.setattr(services, "_layout_may_change", lambda node_id, gpus: False)
    monkeypatch.setattr(services, "layout_lock", lambda: locks.append("lock"))
    version = layout_version()
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, [SEVEN, "A100-80GB"], made=2)
    assert locks == ["lock"]
    assert layout_version() == version + 1
    (gpu,) = devices(mine["id"])
    assert gpu.retired_at is None and gpu.uuid.endswith("-2")


@pytest.mark.django_db
def test_a_move_the_constraint_refuses_tries_the_next_device(
    api_as, alice, node_a, monkeypatch, django_capture_on_commit_callbacks
):
    """The exclusion constraint refuses the first instance picked (a writer that got there first): the booking moves
    to the next free one rather than ending."""
    from apps.booking.services import stranded

    mine = book(api_as(alice), mig_profile="1g.10gb")
    real_move, tried = stranded._move, []

    def first_refused(unit: Any, to: list[Gpu], now: Any) -> bool:
        tried.append(to[0].uuid)
        return False if len(tried) == 1 else real_move(unit, to, now)

    monkeypatch.setattr(stranded, "_move", first_refused)
    with django_capture_on_commit_callbacks(execute=True):
        register(node_a, [SEVEN, "A100-80GB"], made=2)
    reservation = Reservation.objects.get(pk=mine["id"])
    assert reservation.status == ReservationStatus.BOOKED and reservation.released_reason == ""
    (gpu,) = devices(mine["id"])
    assert len(tried) == 2 and gpu.uuid == tried[1] != tried[0] and gpu.retired_at is None
