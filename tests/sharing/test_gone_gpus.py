"""A GPU gone from its node (no longer reported by its registration, or reported lost by its agent) takes its
bookings' devices: each moves to an equal free GPU at once, or, with none free, ends with `released_reason`
"gpu_gone" (running) or waits for its start (the GPU may come back after a reboot) and is cancelled then if nothing
took it. Registrations go through the real service with the simulated backend's reports; bookings through the API."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Allocation, QuotaHold, Reservation, ReservationStatus
from apps.booking.services import reservations_rehome_stranded, reservations_tick
from apps.events.models import OutboxEvent
from apps.fleet import services
from apps.fleet.messages import check_registration
from apps.fleet.models import Gpu, GpuStatus
from tests.factories import GpuModelFactory, NodeFactory
from tests.sharing.test_layout_strands import SEVEN, URL, book, devices, layout_version, register
from workers.gpu.simulated import SimulatedBackend

pytestmark = pytest.mark.django_db


def register_without(node: Any, specs: list[str], *, missing: int) -> None:
    """Register `node` as the simulated backend finds `specs`, but with GPU `missing` not found (pulled, or not
    seen by the driver at the agent's start)."""
    gpus = [g for g in SimulatedBackend(node.name, specs).discover() if g.index != missing]
    payload = {"node": node.name, "token": "x", "ts": None, "gpus": [g.to_dict() for g in gpus], "backend": "simulated"}
    services.node_register(node_id=node.pk, gpus=check_registration(payload).gpus)


def running(client: Any, **extra: Any) -> dict[str, Any]:
    """A booking that started a few minutes ago (on the 15-minute grid), activated by the tick."""
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 15)
    end = start + timedelta(hours=2)
    body = {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}
    resp = client.post(URL, body, "json")
    assert resp.status_code == 201, resp.json()
    reservations_tick()
    assert Reservation.objects.get(pk=resp.json()["id"]).status == ReservationStatus.ACTIVE
    return resp.json()


def status(reservation_id: int) -> tuple[str, str]:
    r = Reservation.objects.get(pk=reservation_id)
    return r.status, r.released_reason


def start_of(reservation: dict[str, Any]) -> datetime:
    return Reservation.objects.get(pk=reservation["id"]).start


@pytest.fixture
def a100(db: Any) -> Any:
    return GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))


@pytest.fixture
def two_nodes(a100: Any) -> tuple[list[str], list[str]]:
    """node-g with two A100s, node-h with one: their uuids."""
    g = [x.uuid for x in register(NodeFactory(name="node-g"), ["A100-80GB", "A100-80GB"])]
    h = [x.uuid for x in register(NodeFactory(name="node-h"), ["A100-80GB"])]
    return g, h


def test_a_pulled_gpu_s_booking_moves_to_an_equal_gpu_on_its_node_first(
    api_as, alice, two_nodes, django_capture_on_commit_callbacks
):
    (g0, g1), (h0,) = two_nodes
    client = api_as(alice)
    mine = book(client, gpus=[g0])
    hold = QuotaHold.objects.get(reservation_id=mine["id"])
    version = layout_version()
    node = Gpu.objects.get(uuid=g0).node
    with django_capture_on_commit_callbacks(execute=True):
        register_without(node, ["A100-80GB", "A100-80GB"], missing=0)
    gone = Gpu.objects.get(uuid=g0)
    assert gone.retired_at is not None and gone.status == GpuStatus.LOST
    assert layout_version() == version + 1  # the registration took the layout guard: the scheduler's view is stale
    assert [d.uuid for d in devices(mine["id"])] == [g1]
    assert status(mine["id"]) == (ReservationStatus.BOOKED, "")
    move = AuditEvent.objects.get(action="reservation.move", target_id=str(mine["id"]))
    assert move.data == {"moves": {g0: g1}, "reason": "gpu_gone"}
    after = QuotaHold.objects.get(pk=hold.pk)
    assert (after.gpus, after.hourly_rate, after.active) == (hold.gpus, hold.hourly_rate, True)
    assert h0 not in {d.uuid for d in devices(mine["id"])}


def test_a_future_booking_of_a_pulled_gpu_waits_for_its_start_and_is_cancelled_then_or_kept_if_it_came_back(
    api_as, alice, bob, two_nodes, django_capture_on_commit_callbacks
):
    (g0, g1), (h0,) = two_nodes
    client = api_as(alice)
    first, second = book(client, gpus=[g0]), book(client, gpus=[g0], days=2)
    for days in (1, 2):  # every other GPU of the model is held in both windows
        book(api_as(bob), gpus=[g1, h0], days=days)
    node = Gpu.objects.get(uuid=g0).node
    with django_capture_on_commit_callbacks(execute=True):
        register_without(node, ["A100-80GB", "A100-80GB"], missing=0)
    # Nothing could take them: they wait (the GPU may come back), and the tick leaves them be until their start.
    assert [d.uuid for d in devices(first["id"])] == [g0] and [d.uuid for d in devices(second["id"])] == [g0]
    assert reservations_rehome_stranded() == {"moved": [], "ended": []}
    assert status(first["id"]) == status(second["id"]) == (ReservationStatus.BOOKED, "")
    # The first one's start comes with the GPU still gone: cancelled, its quota given back, the holder told why.
    at = start_of(first) + timedelta(seconds=30)
    assert reservations_rehome_stranded(now=at) == {"moved": [], "ended": [first["id"]]}
    assert status(first["id"]) == (ReservationStatus.CANCELLED, "gpu_gone")
    assert not QuotaHold.objects.get(reservation_id=first["id"]).active
    event = OutboxEvent.objects.get(event_type="reservation.released", subject=f"reservations/{first['id']}")
    assert event.data["reason"] == "gpu_gone" and event.data["status"] == "cancelled"
    assert "gone from its node" in event.data["message"] and "a whole GPU (A100-80GB)" in event.data["message"]
    # The GPU comes back (a reboot): the second booking keeps it and starts as booked.
    with django_capture_on_commit_callbacks(execute=True):
        register(node, ["A100-80GB", "A100-80GB"])
    assert Gpu.objects.get(uuid=g0).retired_at is None and Gpu.objects.get(uuid=g0).status == GpuStatus.OK
    later = start_of(second) + timedelta(seconds=30)
    assert reservations_rehome_stranded(now=later) == {"moved": [], "ended": []}
    assert second["id"] in reservations_tick(now=later)["activated"]
    assert [d.uuid for d in devices(second["id"])] == [g0]


def test_a_running_booking_of_a_gpu_its_agent_reports_lost_moves_at_once(
    api_as, alice, two_nodes, sent, django_capture_on_commit_callbacks
):
    (g0, g1), _ = two_nodes
    node = Gpu.objects.get(uuid=g0).node
    node.token_digest = "d" * 64  # so the agent is told about the holds
    node.save(update_fields=["token_digest"])
    mine = running(api_as(alice), gpus=[g0])
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert services.gpus_mark_lost(node_id=node.pk, uuids=[g0]) == [g0]
    rows = list(Allocation.objects.filter(reservation_id=mine["id"]).select_related("gpu").order_by("start"))
    assert [(r.gpu.uuid, r.active) for r in rows] == [(g0, True), (g1, True)]
    used, rest = rows
    assert used.end == rest.start and rest.end == Reservation.objects.get(pk=mine["id"]).end
    assert status(mine["id"]) == (ReservationStatus.ACTIVE, "")
    assert any(h["gpu_uuid"] == g1 for body in sent for h in body.get("holds", []))


def test_a_running_booking_of_a_lost_gpu_with_no_equal_one_free_is_released(
    api_as, alice, bob, two_nodes, django_capture_on_commit_callbacks
):
    (g0, g1), (h0,) = two_nodes
    mine = running(api_as(alice), gpus=[g0])
    others = running(api_as(bob), gpus=[g1, h0])
    node = Gpu.objects.get(uuid=g0).node
    with django_capture_on_commit_callbacks(execute=True):
        services.gpus_mark_lost(node_id=node.pk, uuids=[g0])
    assert status(mine["id"]) == (ReservationStatus.RELEASED, "gpu_gone")
    assert status(others["id"]) == (ReservationStatus.ACTIVE, "")
    event = OutboxEvent.objects.get(event_type="reservation.released", subject=f"reservations/{mine['id']}")
    assert event.data["reason"] == "gpu_gone" and event.data["status"] == "released"
    shown = api_as(alice).get(f"{URL}{mine['id']}/").json()
    assert shown["status"] == "released" and shown["released_reason"] == "gpu_gone"


def test_an_instance_of_a_pulled_gpu_moves_to_an_instance_of_another_gpu(
    api_as, alice, a100, django_capture_on_commit_callbacks
):
    node_g = NodeFactory(name="node-g")
    register(node_g, [SEVEN, "A100-80GB"])
    node_h = NodeFactory(name="node-h")
    register(node_h, [SEVEN], made=3)
    parent = Gpu.objects.get(node=node_g, index=0)
    mine = book(api_as(alice), gpus=[parent.uuid], mig_profile="1g.10gb")
    with django_capture_on_commit_callbacks(execute=True):
        gpus = [
            dataclasses.replace(g, mig_devices=tuple(dataclasses.replace(d, uuid=f"{d.uuid}-1") for d in g.mig_devices))
            for g in SimulatedBackend("node-g", [SEVEN, "A100-80GB"]).discover()
            if g.index != 0
        ]
        payload = {"node": "node-g", "token": "x", "ts": None, "gpus": [g.to_dict() for g in gpus]}
        services.node_register(node_id=node_g.pk, gpus=check_registration(payload).gpus)
    (gpu,) = devices(mine["id"])
    assert gpu.node_id == node_h.pk and gpu.mig_profile == "1g.10gb"
    assert status(mine["id"]) == (ReservationStatus.BOOKED, "")


def test_a_periodic_registration_that_changes_nothing_takes_no_guard(two_nodes, monkeypatch):
    (g0, _), _ = two_nodes
    locks: list[str] = []
    monkeypatch.setattr(services, "layout_lock", lambda: locks.append("lock"))
    register(Gpu.objects.get(uuid=g0).node, ["A100-80GB", "A100-80GB"])
    assert locks == []


def test_a_slurm_pool_booking_moves_inside_its_pool_and_is_mirrored_where_it_went(
    api_as, alice, a100, django_capture_on_commit_callbacks
):
    """A GPU of a Slurm pool's node (registered by the pool's bridge) is lost under a running booking: it moves to
    the node's other GPU, not to an agents' node, and what the bridge mirrors into Slurm counts the GPU it holds
    now, not the one it left."""
    from apps.fleet.models import Pool
    from apps.pools.selectors import mirrored_reservations

    pool = Pool.objects.create(name="cluster", backend="slurm")
    slurm_node = NodeFactory(name="node-s", pool=pool)
    s0, s1 = (x.uuid for x in register(slurm_node, ["A100-80GB", "A100-80GB"]))
    register(NodeFactory(name="node-h"), ["A100-80GB"])
    mine = running(api_as(alice), gpus=[s0])
    with django_capture_on_commit_callbacks(execute=True):
        services.gpus_mark_lost(node_id=slurm_node.pk, uuids=[s0])
    assert [d.uuid for d in devices(mine["id"]) if d.uuid != s0] == [s1]
    assert Gpu.objects.get(uuid=s1).node.pool_id == pool.pk
    (mirrored,) = mirrored_reservations(pool)
    assert (mirrored["id"], mirrored["nodes"], mirrored["gpu_count"]) == (mine["id"], ["node-s"], 1)


def test_a_move_skips_gpus_of_nodes_not_online_and_gpus_in_maintenance(
    api_as, alice, a100, django_capture_on_commit_callbacks
):
    """A new booking would not be placed on a draining node or on a GPU or node with maintenance in its window;
    neither is a moved one. A fleet-wide window covers the old GPU as much as any and does not stop a move."""
    from apps.booking.models import MaintenanceWindow
    from apps.fleet.models import Node, NodeStatus

    gone_node = NodeFactory(name="node-a")
    (g0,) = (x.uuid for x in register(gone_node, ["A100-80GB"]))
    nodes = {name: NodeFactory(name=name) for name in ("node-b", "node-c", "node-d", "node-e")}
    uuids = {name: register(node, ["A100-80GB"])[0].uuid for name, node in nodes.items()}
    Node.objects.filter(name="node-b").update(status=NodeStatus.DRAINING)
    mine = book(api_as(alice), gpus=[g0])
    r = Reservation.objects.get(pk=mine["id"])
    MaintenanceWindow.objects.create(node=nodes["node-c"], start=r.start, end=r.start + timedelta(minutes=30))
    MaintenanceWindow.objects.create(
        gpu=Gpu.objects.get(uuid=uuids["node-d"]), start=r.end - timedelta(minutes=1), end=r.end + timedelta(days=1)
    )
    MaintenanceWindow.objects.create(start=r.start, end=r.end)  # the whole fleet
    with django_capture_on_commit_callbacks(execute=True):
        register_without(gone_node, ["A100-80GB"], missing=0)
    assert [d.uuid for d in devices(mine["id"])] == [uuids["node-e"]]
