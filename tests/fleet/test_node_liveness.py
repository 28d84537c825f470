"""Heartbeats, the offline sweep, draining: a node's status and its GPUs' follow one set of rules."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.fleet import services
from apps.fleet.models import Gpu, GpuStatus, Node, NodeStatus
from tests.factories import NodeFactory
from tests.fleet.util import registered_node

pytestmark = pytest.mark.django_db


def test_a_node_silent_past_the_timeout_goes_offline_with_its_gpus(settings) -> None:
    settings.FLEET_HEARTBEAT_TIMEOUT_S = 30
    node, _ = registered_node("n1")
    now = timezone.now()
    assert services.nodes_mark_offline(now=now + timedelta(seconds=29)) == []
    assert services.nodes_mark_offline(now=now + timedelta(seconds=31)) == ["n1"]
    node.refresh_from_db()
    assert node.status == NodeStatus.OFFLINE
    assert set(Gpu.objects.filter(node=node).values_list("status", flat=True)) == {GpuStatus.OFFLINE}
    event = AuditEvent.objects.filter(action="node.offline", target_id=str(node.pk)).get()
    assert event.data["from"] == "online"
    assert services.nodes_mark_offline(now=now + timedelta(seconds=60)) == []  # once


def test_a_heartbeat_brings_an_offline_node_back(settings) -> None:
    node, _ = registered_node("n1")
    services.nodes_mark_offline(now=timezone.now() + timedelta(seconds=settings.FLEET_HEARTBEAT_TIMEOUT_S + 1))
    assert services.node_heartbeat(node_id=node.pk) == NodeStatus.ONLINE
    assert set(Gpu.objects.filter(node=node).values_list("status", flat=True)) == {GpuStatus.OK}
    assert AuditEvent.objects.filter(action="node.online", target_id=str(node.pk)).count() == 2  # register + back


def test_a_draining_node_comes_back_draining(settings, admin) -> None:
    node, _ = registered_node("n1")
    services.node_drain(actor=admin, node_name="n1")
    services.nodes_mark_offline(now=timezone.now() + timedelta(seconds=settings.FLEET_HEARTBEAT_TIMEOUT_S + 1))
    assert Node.objects.get(pk=node.pk).status == NodeStatus.OFFLINE
    assert services.node_heartbeat(node_id=node.pk) == NodeStatus.DRAINING
    services.node_drain(actor=admin, node_name="n1", draining=False)
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE


def test_a_degraded_gpu_stays_degraded_across_an_outage(settings) -> None:
    node, _ = registered_node("n1")
    services.gpu_probe_record(node_id=node.pk, gpu_uuid="GPU-n1-0", result={"degraded": True, "comparison": "degraded"})
    services.nodes_mark_offline(now=timezone.now() + timedelta(seconds=settings.FLEET_HEARTBEAT_TIMEOUT_S + 1))
    services.node_heartbeat(node_id=node.pk)
    assert Gpu.objects.get(uuid="GPU-n1-0").status == GpuStatus.DEGRADED
    assert Gpu.objects.get(uuid="GPU-n1-1").status == GpuStatus.OK


def test_a_fine_probe_clears_degraded() -> None:
    node, _ = registered_node("n1")
    services.gpu_probe_record(node_id=node.pk, gpu_uuid="GPU-n1-0", result={"degraded": True})
    services.gpu_probe_record(node_id=node.pk, gpu_uuid="GPU-n1-0", result={"degraded": False})
    assert Gpu.objects.get(uuid="GPU-n1-0").status == GpuStatus.OK
    services.gpu_probe_record(node_id=node.pk, gpu_uuid="GPU-n1-0", result=None, error="no torch")
    gpu = Gpu.objects.get(uuid="GPU-n1-0")
    assert gpu.status == GpuStatus.OK and gpu.probe == {"error": "no torch"}


def test_nodes_that_never_heartbeated_are_left_alone() -> None:
    NodeFactory(name="by-hand", status=NodeStatus.ONLINE)
    assert services.nodes_mark_offline(now=timezone.now() + timedelta(days=1)) == []


def test_draining_an_unknown_node_is_not_found(admin) -> None:
    from apps.core.errors import NotFound

    with pytest.raises(NotFound):
        services.node_drain(actor=admin, node_name="nope")
