"""POST drain/undrain and probe: admin only; the probe is a signed command on the node's own queue."""

from __future__ import annotations

import base64
import json

import pytest

from apps.audit.models import AuditEvent
from apps.core.redis import get_redis
from apps.fleet.models import Node, NodeStatus
from tests.fleet.util import registered_node
from workers.transport import CommandRejected, verify_command

pytestmark = pytest.mark.django_db


def _queued(queue: str) -> list[tuple[str, dict]]:
    """(task name, first argument) of the messages waiting in a Celery queue (kombu's Redis list)."""
    out = []
    for raw in get_redis().lrange(queue, 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], args[0]))
    return out


@pytest.mark.parametrize("action", ["drain", "undrain"])
def test_anonymous_cannot_drain(api_as, action: str) -> None:
    registered_node("n1")
    assert api_as(None).post(f"/api/v1/nodes/n1/{action}/").status_code == 401


@pytest.mark.parametrize("who", ["alice", "bob", "charlie"])
def test_non_admins_cannot_drain(request, api_as, who: str) -> None:
    registered_node("n1")
    response = api_as(request.getfixturevalue(who)).post("/api/v1/nodes/n1/drain/")
    assert response.status_code == 403
    assert Node.objects.get(name="n1").draining is False


def test_an_admin_token_without_admin_scope_cannot_drain(api_as, admin) -> None:
    registered_node("n1")
    response = api_as(admin, scopes=["read"]).post("/api/v1/nodes/n1/drain/")
    assert response.status_code == 403 and response.json()["code"] == "insufficient_scope"


def test_admin_drains_and_undrains(api_as, admin) -> None:
    registered_node("n1")
    client = api_as(admin)
    body = client.post("/api/v1/nodes/n1/drain/").json()
    assert body["status"] == "draining" and body["draining"] is True
    assert client.post("/api/v1/nodes/n1/drain/").json()["status"] == "draining"  # idempotent
    assert AuditEvent.objects.filter(action="node.drain").count() == 1
    body = client.post("/api/v1/nodes/n1/undrain/").json()
    assert body["status"] == NodeStatus.ONLINE and body["draining"] is False
    assert client.post("/api/v1/nodes/nope/drain/").status_code == 404


def test_non_admins_cannot_probe(api_as, bob) -> None:
    registered_node("n1")
    assert api_as(bob).post("/api/v1/gpus/GPU-n1-0/probe/").status_code == 403
    assert _queued("node.n1") == []


def test_admin_probe_sends_a_command_only_that_node_accepts(api_as, admin, django_capture_on_commit_callbacks) -> None:
    _, token = registered_node("n1")
    _, other_token = registered_node("n2")
    with django_capture_on_commit_callbacks(execute=True):
        response = api_as(admin).post("/api/v1/gpus/GPU-n1-1/probe/")
    assert response.status_code == 202
    assert response.json() == {"gpu": "GPU-n1-1", "node": "n1", "status": "requested"}
    [(task, envelope)] = _queued("node.n1")
    assert task == "agent.run_probe"
    assert verify_command(envelope, node="n1", token=token, task="agent.run_probe") == {"gpu_uuid": "GPU-n1-1"}
    with pytest.raises(CommandRejected):
        verify_command(envelope, node="n1", token=other_token, task="agent.run_probe")
    with pytest.raises(CommandRejected):
        verify_command({**envelope, "body": {"gpu_uuid": "GPU-n1-0"}}, node="n1", token=token, task="agent.run_probe")


def test_probe_of_an_offline_node_is_a_conflict(api_as, admin) -> None:
    node, _ = registered_node("n1")
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)
    response = api_as(admin).post("/api/v1/gpus/GPU-n1-0/probe/")
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert api_as(admin).post("/api/v1/gpus/GPU-nope/probe/").status_code == 404
