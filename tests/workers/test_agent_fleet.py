"""Node agents as real processes against a real portal worker (Celery, with beat), Redis and the test database:
register, heartbeat, stream; a SIGKILLed agent's node goes offline within the timeout and comes back, without
duplicate rows, when it restarts; bad messages on the control queue are refused without harming the worker;
holds and probes reach the agent and come back."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.core.redis import get_redis
from apps.fleet import services
from apps.fleet.commands import agent_send
from apps.fleet.models import Gpu, Node, NodeStatus
from apps.telemetry import keys
from tests.fleet.procs import clean_fleet_redis, start_agent, start_ingest, start_portal_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 3
CHECK_S = 1


def _gpus(client: Any) -> dict[str, dict[str, Any]]:
    body = client.get("/api/v1/gpus/?limit=100").json()
    return {g["uuid"]: g for g in body["results"]}


def _status(name: str) -> str:
    return str(Node.objects.get(name=name).status)


def test_agents_register_stream_die_and_come_back(tmp_path, api_as, admin) -> None:
    clean_fleet_redis()
    names = ["a1", "a2", "a3"]
    tokens = {name: services.node_token_issue(node_name=name)[1] for name in names}
    worker = start_portal_worker(
        tmp_path,
        FLEET_HEARTBEAT_TIMEOUT_S=str(TIMEOUT_S),
        FLEET_OFFLINE_CHECK_S=str(CHECK_S),
        FLEET_NODE_CACHE_S="2",
        LOG_LEVEL="INFO",
    )
    ingest = start_ingest(tmp_path, FLEET_NODE_CACHE_S="2")
    # a1 and a3 stream their telemetry (the default), a2 sends it as Celery tasks: both paths end in the same place.
    via = {"a1": "stream", "a2": "celery", "a3": "stream"}
    agents = {n: start_agent(tmp_path, n, tokens[n], seed=i, telemetry_via=via[n]) for i, n in enumerate(names)}
    procs = [worker, ingest, *agents.values()]
    client = api_as(admin)
    try:
        # Registration and heartbeats.
        wait_for(lambda: Gpu.objects.filter(retired_at__isnull=True).count() == 6, 60, "6 GPUs registered", procs)
        wait_for(lambda: all(_status(n) == NodeStatus.ONLINE for n in names), 30, "all nodes online", procs)
        ids = dict(Gpu.objects.values_list("uuid", "id"))

        # Live telemetry through the API, changing second by second.
        first = wait_for(
            lambda: (g := _gpus(client)) and all(not x["stale"] for x in g.values()) and g, 30, "fresh telemetry", procs
        )
        assert {g["node"] for g in first.values()} == set(names)
        busy = [u for u, g in first.items() if g["index"] == 0]
        assert all(first[u]["memory_used_mib"] > 1000 for u in busy)  # --simulate-busy 1: GPU 0 runs a workload

        def changed() -> bool:
            now = _gpus(client)
            return all(now[u]["sampled_at"] > first[u]["sampled_at"] for u in first) and any(
                (now[u]["power_w"], now[u]["temperature_c"], now[u]["utilization"])
                != (first[u]["power_w"], first[u]["temperature_c"], first[u]["utilization"])
                for u in first
            )

        wait_for(changed, 15, "telemetry to change", procs)

        # SIGKILL one agent: its node goes offline within the timeout (plus one sweep), the others stay up.
        agents["a2"].kill()
        killed_at = time.monotonic()
        wait_for(lambda: _status("a2") == NodeStatus.OFFLINE, TIMEOUT_S + CHECK_S + 10, "a2 offline", procs)
        elapsed = time.monotonic() - killed_at
        assert elapsed <= TIMEOUT_S + CHECK_S + 4, elapsed
        assert _status("a1") == _status("a3") == NodeStatus.ONLINE
        assert set(Gpu.objects.filter(node__name="a2").values_list("status", flat=True)) == {"offline"}
        assert AuditEvent.objects.filter(action="node.offline", target_repr="a2").exists()
        wait_for(lambda: all(g["stale"] for g in _gpus(client).values() if g["node"] == "a2"), 15, "a2 stale", procs)

        # Restart it: online again, same rows, no duplicates.
        agents["a2"] = start_agent(tmp_path, "a2", tokens["a2"], seed=1, telemetry_via="celery")
        procs = [worker, ingest, *agents.values()]
        wait_for(lambda: _status("a2") == NodeStatus.ONLINE, 30, "a2 back online", procs)
        assert dict(Gpu.objects.values_list("uuid", "id")) == ids
        wait_for(lambda: not any(g["stale"] for g in _gpus(client).values()), 20, "a2 streaming again", procs)

        # Garbage on the control queue: refused and counted; the worker carries on, nothing is written.
        from portal.celery import app

        rejected_before = int(get_redis().hget(keys.STATS, "messages_rejected") or 0)
        bad = [
            ("fleet.register", {"node": "a1", "token": tokens["a3"], "gpus": []}),  # another node's token
            ("fleet.register", {"node": "ghost", "token": tokens["a1"], "gpus": []}),  # unknown node
            ("fleet.heartbeat", ["not", "an", "object"]),
            (
                "telemetry.ingest",
                {
                    "type": "telemetry",
                    "v": 1,
                    "node": "a1",
                    "token": tokens["a1"],
                    "ts": time.time(),
                    "seq": 1,
                    "g": [[next(iter(ids)), 500, 1, 2, 3, 4.0, 5, 0.1]],
                },
            ),  # util 500
            ("fleet.probe_result", {"node": "a1", "token": tokens["a1"], "gpu_uuid": "GPU-x", "error": "e" * 5000}),
            ("fleet.register", {"node": f"a2 {tokens['a2']}", "token": "x", "gpus": []}),  # a token where a name goes
        ]
        for task, payload in bad:
            app.send_task(task, args=[payload], queue="control")
        wait_for(
            lambda: int(get_redis().hget(keys.STATS, "messages_rejected") or 0) >= rejected_before + 4,
            20,
            "rejections counted",
            procs,
        )
        assert worker.alive() and ingest.alive()
        # The refusal names the node as it came, and the worker's log masks the token in it (Django's LOGGING).
        wait_for(lambda: "gpn_[redacted]" in worker.log.read_text(), 10, "the refusal logged", procs)
        assert tokens["a2"] not in worker.log.read_text()
        assert Node.objects.count() == 3 and Gpu.objects.count() == 6
        assert Gpu.objects.filter(node__name="a1", retired_at__isnull=True).count() == 2
        assert _status("a1") == NodeStatus.ONLINE

        # Holds reach the agent's state file.
        a1_gpu = Gpu.objects.filter(node__name="a1").order_by("index").first()
        until = "2099-01-01T00:00:00+00:00"
        hold = {"gpu_uuid": a1_gpu.uuid, "team": "vision", "reservation_id": 42, "until": until}
        agent_send(node=Node.objects.get(name="a1"), task="agent.hold_gpus", body={"holds": [hold]})
        state = tmp_path / "agent-a1" / "holds.json"
        wait_for(state.exists, 20, "holds stored by the agent", procs)
        assert json.loads(state.read_text())["holds"][0]["reservation_id"] == 42

        # The probe: API -> signed command -> agent runs torch_probe (CPU, simulated GPU) -> fleet.probe_result.
        response = client.post(f"/api/v1/gpus/{a1_gpu.uuid}/probe/")
        assert response.status_code == 202
        wait_for(lambda: Gpu.objects.get(pk=a1_gpu.pk).probe is not None, 120, "probe result", procs)
        probe = Gpu.objects.get(pk=a1_gpu.pk).probe
        assert probe.get("comparison") == "n/a" or "error" in probe, probe
        assert _gpus(client)[a1_gpu.uuid]["probe_verdict"] in ("n/a", "error")
    finally:
        for p in reversed(procs):
            p.stop()


def test_the_agent_masks_tokens_in_its_own_log_and_in_celerys(tmp_path) -> None:
    # A token pasted where the node's name goes: the agent's own start line (before Celery's worker starts) and the
    # worker's "ready" line (after Celery replaced the root logger's handlers) both name the node. --quiet: Celery's
    # start banner is printed, not logged (it names the node too; `make run` starts the agent quiet).
    clean_fleet_redis()
    token = "gpn_" + "Zq7" * 10
    agent = start_agent(tmp_path, token, "x", extra=["--quiet"])
    try:
        wait_for(lambda: " ready." in agent.log.read_text(), 60, "the agent's worker ready", [agent])
        log = agent.log.read_text()
        assert token not in log
        assert "agent gpn_[redacted]: 2 simulated GPU(s)" in log
        assert "agent-gpn_[redacted]@" in log
    finally:
        agent.stop()
    clean_fleet_redis()
