"""The whole job path as real processes, for end-to-end tests and the e2e benchmark.

uvicorn (the REST API) + the portal's Celery worker (queues portal and control, with beat) + `manage.py scheduler`
+ node agents (`python -m workers.agent`, simulated GPUs, docker or process runtime), on the test database and
Redis. Everything goes through the same doors production uses: REST in, broker between, agent reports back.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from django.conf import settings

from tests.conftest import LiveServer, start_live_server, subprocess_env
from tests.fleet.procs import Proc, clean_fleet_redis, start_portal_worker, wait_for

TERMINAL = {"succeeded", "failed", "cancelled", "lost"}


def start_scheduler(tmp: Path, **env: str) -> Proc:
    argv = [sys.executable, "manage.py", "scheduler", "--interval", env.pop("INTERVAL", "0.5")]
    return Proc(argv, subprocess_env(LOG_LEVEL="INFO", **env), tmp / f"scheduler-{time.monotonic_ns()}.log")


def start_job_agent(
    tmp: Path,
    name: str,
    token: str,
    *,
    runtime: str,
    docker_url: str = "",
    gpus: int = 4,
    models: str = "A100-80GB",
    heartbeat: float = 1.0,
    concurrency: int = 4,
) -> Proc:
    argv = [sys.executable, "-m", "workers.agent", "--name", name, "--backend", "simulated", "--gpus", str(gpus)]
    argv += ["--models", models, "--heartbeat", str(heartbeat), "--state-dir", str(tmp / f"agent-{name}")]
    argv += ["--concurrency", str(concurrency)]
    # The agent holds no database credentials: only the broker and its node token.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "DJANGO"))}
    env.update(
        {
            "GPUPORTAL_NODE_TOKEN": token,
            "GPUPORTAL_BROKER_URL": settings.REDIS.redis_py_url,
            "GPUPORTAL_RUNTIME": runtime,
            "GPUPORTAL_DOCKER_HOST": docker_url,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return Proc(argv, env, tmp / f"agent-{name}-{time.monotonic_ns()}.log")


@dataclass
class Stack:
    """The running processes and a REST client for one user."""

    tmp: Path
    server: LiveServer
    worker: Proc
    scheduler: Proc
    agents: dict[str, Proc]
    tokens: dict[str, str]
    api_token: str
    runtime: str
    docker_url: str = ""
    extra: list[Proc] = field(default_factory=list)

    @property
    def procs(self) -> list[Proc]:
        return [self.worker, self.scheduler, *self.agents.values(), *self.extra]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_token}"}

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, f"{self.server.url}{path}", headers=self.headers, timeout=30, **kwargs)

    def submit(self, **body: Any) -> dict[str, Any]:
        body.setdefault("team", "vision")
        body.setdefault("gpu_count", 1)
        body.setdefault("max_duration_s", 120)
        resp = self.api("POST", "/api/v1/jobs/", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    def job(self, job_id: int) -> dict[str, Any]:
        resp = self.api("GET", f"/api/v1/jobs/{job_id}/")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def logs(self, job_id: int) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        after = 0
        deadline = time.monotonic() + 30.0
        while True:
            body = self.api("GET", f"/api/v1/jobs/{job_id}/logs/?after={after}&limit=5000").json()
            lines.extend(body["lines"])
            after = body["last_seq"]
            if body["waiting"] and time.monotonic() < deadline:  # a late line may still land: read on
                time.sleep(0.2)
                continue
            if not body["more"]:
                return lines

    def wait_state(self, job_id: int, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (job := self.job(job_id))["state"] in states and job,
                timeout,
                f"job {job_id} to become {'/'.join(sorted(states))}",
                self.procs,
            )
        )

    def wait_done(self, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
        """The final job, once its logs are all stored too."""
        self.wait_state(job_id, TERMINAL, timeout)
        return dict(wait_for(lambda: (job := self.job(job_id))["logs_complete"] and job, 15, "logs", self.procs))

    def restart_agent(self, name: str) -> Proc:
        old = self.agents[name]
        proc = start_job_agent(self.tmp, name, self.tokens[name], runtime=self.runtime, docker_url=self.docker_url)
        self.agents[name] = proc
        self.extra.append(old)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.server.stop()


def start_stack(
    tmp: Path,
    *,
    user: Any,
    make_token: Callable[..., str],
    runtime: str,
    docker_url: str = "",
    nodes: int = 1,
    gpus: int = 4,
    worker_env: dict[str, str] | None = None,
    scheduler_env: dict[str, str] | None = None,
) -> Stack:
    """Start everything and wait until the nodes are online with their GPUs (call inside transaction=True tests)."""
    from apps.fleet import services as fleet
    from apps.fleet.models import Gpu, Node, NodeStatus

    clean_fleet_redis()
    names = [f"jobnode{i}" for i in range(nodes)]
    tokens = {name: fleet.node_token_issue(node_name=name)[1] for name in names}
    server = start_live_server()
    worker_env = {"FLEET_HEARTBEAT_TIMEOUT_S": "4", "FLEET_OFFLINE_CHECK_S": "1", **(worker_env or {})}
    worker = start_portal_worker(tmp, **worker_env)
    scheduler = start_scheduler(tmp, **(scheduler_env or {}))
    agents = {
        name: start_job_agent(tmp, name, tokens[name], runtime=runtime, docker_url=docker_url, gpus=gpus)
        for name in names
    }
    stack = Stack(
        tmp=tmp,
        server=server,
        worker=worker,
        scheduler=scheduler,
        agents=agents,
        tokens=tokens,
        api_token=make_token(user, ["read", "jobs:write"]),
        runtime=runtime,
        docker_url=docker_url,
    )
    try:
        wait_for(
            lambda: (
                Node.objects.filter(name__in=names, status=NodeStatus.ONLINE).count() == nodes
                and Gpu.objects.filter(node__name__in=names, status="ok").count() == nodes * gpus
            ),
            90,
            "the nodes online with their GPUs",
            stack.procs,
        )
    except BaseException:
        stack.stop()
        raise
    return stack
