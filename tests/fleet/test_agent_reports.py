"""The control-queue tasks: a node reports only for itself; bad reports are refused, counted, and write nothing."""

from __future__ import annotations

import time

import pytest

from apps.core.redis import get_redis
from apps.fleet import tasks
from apps.fleet.models import Gpu, Node, NodeStatus
from apps.telemetry import keys
from tests.fleet.util import registered_node, registration

pytestmark = pytest.mark.django_db


def _rejections() -> dict[str, int]:
    return {k.decode(): int(v) for k, v in get_redis().hgetall(keys.STATS).items()}


def test_register_task_registers_a_node_with_its_token() -> None:
    from apps.fleet import services

    _, token = services.node_token_issue(node_name="n1")
    tasks.register(registration("n1", token))
    assert Gpu.objects.filter(node__name="n1").count() == 2
    assert Node.objects.get(name="n1").status == NodeStatus.ONLINE


@pytest.mark.parametrize(
    ("make_payload", "reason"),
    [
        (lambda token: registration("n1", token[:-1] + ("A" if token[-1] != "A" else "B")), "bad_token"),
        (lambda token: registration("n1", "gpp_0123456789_" + "x" * 30), "bad_token"),  # a personal token
        (lambda token: registration("ghost", token), "unknown_node"),
        (lambda token: {**registration("n1", token), "gpus": [{"uuid": "GPU-1", "index": 999}]}, "out_of_range"),
        (lambda token: "not json object", "malformed"),
    ],
)
def test_a_bad_registration_writes_nothing(make_payload, reason: str) -> None:
    from apps.fleet import services

    _, token = services.node_token_issue(node_name="n1")
    tasks.register(make_payload(token))  # must not raise
    assert Gpu.objects.count() == 0
    assert Node.objects.get(name="n1").status == NodeStatus.OFFLINE
    assert _rejections()[f"rejected:{reason}"] == 1


def test_one_nodes_token_does_not_work_for_another() -> None:
    registered_node("n1")
    _, token2 = registered_node("n2")
    before = Node.objects.get(name="n1").last_heartbeat
    tasks.heartbeat({"node": "n1", "token": token2, "ts": time.time()})
    assert Node.objects.get(name="n1").last_heartbeat == before
    assert _rejections()["rejected:bad_token"] == 1


def test_heartbeat_stamps_the_node() -> None:
    node, token = registered_node("n1")
    tasks.heartbeat({"node": "n1", "token": token, "ts": time.time(), "agent_version": "0.1.0"})
    assert Node.objects.get(pk=node.pk).last_heartbeat > node.last_heartbeat


def test_probe_result_for_a_gpu_of_another_node_is_refused() -> None:
    _, token1 = registered_node("n1")
    registered_node("n2")
    tasks.probe_result({"node": "n1", "token": token1, "gpu_uuid": "GPU-n2-0", "result": {"degraded": True}})
    assert Gpu.objects.get(uuid="GPU-n2-0").probe is None
    assert _rejections()["rejected:unknown_gpu"] == 1


def test_probe_result_is_stored() -> None:
    _, token = registered_node("n1")
    result = {"degraded": True, "comparison": "degraded", "below": ["bandwidth_gbs"]}
    tasks.probe_result({"node": "n1", "token": token, "gpu_uuid": "GPU-n1-1", "result": result})
    gpu = Gpu.objects.get(uuid="GPU-n1-1")
    assert gpu.probe == result and gpu.status == "degraded" and gpu.probed_at is not None
