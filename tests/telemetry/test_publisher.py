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
