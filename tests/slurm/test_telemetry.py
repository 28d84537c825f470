"""Live telemetry on a Slurm node: the portal's agent in telemetry-only mode (simulated NVML here) registers the
node's GPUs in place of the bridge's, samples them, and runs no jobs; a Slurm job's GPUs are matched to those
rows by node and GPU index, so the job's GPUs carry live utilization."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.conftest import LiveServer
from tests.fleet.procs import Proc, start_ingest, start_portal_worker
from tests.slurm.bridge_procs import POOL, BridgeStack, make_stack, running_stack
from tests.support.slurm import Slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]
AGENT_MODEL = "A100-80GB"


@pytest.fixture
def stack(slurm: Slurm, live_portal: LiveServer, alice: Any, make_token: Any, tmp_path: Path) -> Iterator[BridgeStack]:
    yield from running_stack(make_stack(slurm, live_portal, alice, make_token, tmp_path))


def _node_gpus(stack: BridgeStack) -> list[dict[str, Any]]:
    pools = {p["name"]: p for p in stack.api("GET", "/api/v1/pools/").json()}
    return [g for g in pools[POOL]["gpus"] if g["node"] == stack.slurm.node]


def test_telemetry_only_agent_feeds_slurm_jobs_gpus(stack: BridgeStack, tmp_path: Path) -> None:
    from apps.fleet.services import node_token_issue
    from apps.jobs.models import Job

    _, token = node_token_issue(node_name=stack.slurm.node)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "DJANGO"))}
    env.update({"GPUPORTAL_NODE_TOKEN": token, "GPUPORTAL_BROKER_URL": settings.REDIS.redis_py_url})
    argv = [sys.executable, "-m", "workers.agent", "--name", stack.slurm.node, "--backend", "simulated", "--gpus",
            str(stack.slurm.gpu_count), "--models", AGENT_MODEL, "--heartbeat", "1", "--telemetry-only"]  # fmt: skip
    procs = [start_portal_worker(tmp_path), start_ingest(tmp_path), Proc(argv, env, tmp_path / "agent.log")]
    try:
        gpus = stack.wait(
            lambda: (g := _node_gpus(stack)) and all(not x["uuid"].startswith("slurm:") for x in g) and g,
            60,
            "the agent's GPUs in place of the bridge's",
        )
        assert sorted(g["index"] for g in gpus) == list(range(stack.slurm.gpu_count))
        time.sleep(6)  # a bridge inventory (every 5 s here) must not take them back
        assert all(not g["uuid"].startswith("slurm:") for g in _node_gpus(stack))
        job_id = stack.submit(["sleep", "4"], gpu_model=AGENT_MODEL, gpu_count=2)
        stack.wait_state(job_id, {"running"})
        held = set(Job.objects.get(pk=job_id).gpus.values_list("uuid", flat=True))
        assert len(held) == 2 and held <= {g["uuid"] for g in gpus}
        live = stack.wait(
            lambda: [
                g for g in stack.api("GET", "/api/v1/gpus/").json()["results"] if g["uuid"] in held and g["sampled_at"]
            ],
            30,
            "live telemetry of the job's GPUs",
        )
        assert len(live) == 2
        assert stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"})["state"] == "succeeded"
        assert procs[2].alive()  # no job runtime to trip over: it only samples
    finally:
        for proc in reversed(procs):
            proc.stop()
