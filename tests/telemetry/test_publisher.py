"""The fleet publisher: one JSON snapshot per tick on fleet:snapshots, in the shape of keys.Snapshot."""

from __future__ import annotations

import json
import threading
import time

import pytest

from apps.core.redis import get_redis
from apps.fleet.models import Node, NodeStatus
from apps.telemetry import keys
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.publisher import FleetPublisher
from tests.fleet.util import registered_node, row, telemetry

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_snapshot_lists_every_gpu_with_its_sample_state_and_holder(monkeypatch) -> None:
    _, token = registered_node("n1")
    registered_node("n2", ("L40S-48GB",))
    Node.objects.filter(name="n2").update(status=NodeStatus.OFFLINE)
    telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=12)]))
    holder = {"kind": "job", "id": 3, "team": "vision", "team_id": 1, "user": "bob", "until": None}
    monkeypatch.setattr("apps.telemetry.publisher.gpu_holders", lambda: {"GPU-n1-1": holder})
    pubsub = get_redis().pubsub()
    pubsub.subscribe(keys.SNAPSHOTS_CHANNEL)
    pubsub.get_message(timeout=1)  # the subscribe confirmation
    publisher = FleetPublisher()
    first = publisher.publish_once()
    second = publisher.publish_once()
    assert second["seq"] == first["seq"] + 1
    message = pubsub.get_message(timeout=2)
    snap = json.loads(message["data"])
    assert snap["type"] == "fleet" and snap["seq"] == first["seq"]
    assert snap["ts"].endswith("+00:00")
    gpus = {g["uuid"]: g for g in snap["gpus"]}
    assert list(gpus) == ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0"]
    live = gpus["GPU-n1-0"]
    assert live["util"] == 12 and live["stale"] is False and live["node_status"] == "online" and live["holder"] is None
    assert set(live) >= {
        "uuid",
        "node",
        "index",
        "model",
        "util",
        "mem_used",
        "mem_total",
        "temp",
        "power",
        "sm_clock",
        "ts",
        "status",
        "node_status",
        "stale",
        "holder",
    }
    assert gpus["GPU-n1-1"]["holder"] == holder and gpus["GPU-n1-1"]["util"] is None
    assert gpus["GPU-n2-0"]["node_status"] == "offline" and gpus["GPU-n2-0"]["mem_total"] == 46068
    assert {n["name"]: n["status"] for n in snap["nodes"]} == {"n1": "online", "n2": "offline"}
    assert json.loads(get_redis().get(keys.SNAPSHOT_LAST))["seq"] == second["seq"]
    pubsub.close()


def test_the_loop_publishes_about_once_a_second_and_stops_promptly() -> None:
    registered_node("n1")
    publisher = FleetPublisher(period_s=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,))
    thread.start()
    time.sleep(1.1)
    stop.set()
    thread.join(2)
    assert not thread.is_alive()
    assert 5 <= publisher.published <= 7


def test_a_snapshot_says_which_gpus_are_in_use_outside_the_portal_and_by_whom(alice, monkeypatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.booking.models import Allocation
    from apps.fleet.models import Gpu
    from apps.identity.services import unix_uid_set

    unix_uid_set(user=alice, uid=1001, source="manual")
    _, token = registered_node("n1", ("A100-80GB", "H100-80GB", "H100-80GB", "H100-80GB"))
    listing = {"o": [20480], "ou": [[1001, 20000], [4242, 480]]}
    rows = [row(f"GPU-n1-{i}", util=0, mem=20480, extra=listing) for i in range(3)] + [row("GPU-n1-3", mem=600)]
    telemetry_ingest(telemetry("n1", token, rows))
    holder = {"kind": "job", "id": 3, "team": "vision", "team_id": 1, "user": "bob", "until": None}
    monkeypatch.setattr("apps.telemetry.publisher.gpu_holders", lambda: {"GPU-n1-2": holder})
    ended = timezone.now() - timedelta(seconds=5)
    Allocation.objects.create(
        gpu=Gpu.objects.get(uuid="GPU-n1-1"), team=alice.memberships.get().team, user=alice, kind="job",
        start=ended - timedelta(hours=1), end=ended,
    )  # fmt: skip
    gpus = {g["uuid"]: g for g in FleetPublisher().publish_once()["gpus"]}
    assert gpus["GPU-n1-0"]["outside"] == {
        "mib": 20480,
        "by": [{"user": "alice", "teams": ["vision"], "mib": 20000}, {"uid": 4242, "mib": 480}],
    }
    assert "outside" not in gpus["GPU-n1-1"]  # released 5 s ago: what it shows may be the job that just ended
    assert "outside" not in gpus["GPU-n1-2"]  # held: its memory is its holder's
    assert "outside" not in gpus["GPU-n1-3"]  # the driver's own
    # Stale figures say nothing about now.
    later = time.time() + keys.STALE_AFTER_S + 5
    assert "outside" not in {g["uuid"]: g for g in FleetPublisher().build(now=later)["gpus"]}["GPU-n1-0"]
