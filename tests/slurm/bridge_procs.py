"""The portal (uvicorn), a Slurm pool with its bridge process, and a user's token: what the bridge tests drive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.conftest import REPO, LiveServer
from tests.support.slurm import Slurm

POOL = "cluster"
MODEL = "A100-SXM4"
IMAGE = "slurm/process"
TERMINAL = {"succeeded", "failed", "cancelled", "lost"}


@dataclass
class BridgeStack:
    slurm: Slurm
    server: LiveServer
    bridge_token: str
    api_token: str
    tmp: Path
    bridge: subprocess.Popen[bytes] | None = None

    @property
    def spool(self) -> Path:
        return self.tmp / "spool"

    def start_bridge(self) -> None:
        # The bridge gets Slurm's environment and its token, never the database's.
        env = {k: v for k, v in self.slurm.env.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
        env.update({"GPUPORTAL_URL": self.server.url, "GPUPORTAL_BRIDGE_TOKEN": self.bridge_token})
        env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
        argv = [sys.executable, "-m", "workers.slurm_bridge", "--pool", POOL, "--spool", str(self.spool)]
        argv += ["--poll", "0.5", "--inventory", "5", "--usage", "2", "--models", json.dumps({"a100": MODEL})]
        log = open(self.tmp / "bridge.log", "ab")  # noqa: SIM115 - the child's
        self.bridge = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()

    def kill_bridge(self) -> None:
        if self.bridge is not None and self.bridge.poll() is None:
            self.bridge.kill()
            self.bridge.wait(10)
        self.bridge = None

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.api_token}"}
        return requests.request(method, f"{self.server.url}{path}", headers=headers, timeout=30, **kwargs)

    def submit(self, command: list[str], **body: Any) -> int:
        body = {"team": "vision", "image": IMAGE, "gpu_model": MODEL, "gpu_count": 1, "max_duration_s": 120,
                "command": command, **body}  # fmt: skip
        resp = self.api("POST", "/api/v1/jobs/", json=body)
        assert resp.status_code == 201, resp.text
        return int(resp.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        resp = self.api("GET", f"/api/v1/jobs/{job_id}/")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def wait(self, what: Callable[[], Any], timeout: float, message: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            if self.bridge is not None and self.bridge.poll() is not None:
                raise AssertionError(f"the bridge exited: {self.log()[-3000:]}")
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {message}; bridge log:\n{self.log()[-3000:]}")

    def wait_state(self, job_id: int, states: set[str], timeout: float = 90) -> dict[str, Any]:
        return dict(self.wait(lambda: (j := self.job(job_id))["state"] in states and j, timeout, f"{states}"))

    def log(self) -> str:
        path = self.tmp / "bridge.log"
        return path.read_text(errors="replace") if path.exists() else ""


def make_stack(slurm: Slurm, server: LiveServer, user: Any, make_token: Callable[..., str], tmp: Path) -> BridgeStack:
    from apps.jobs.models import ContainerImage
    from apps.pools.services import pool_create_token

    ContainerImage.objects.get_or_create(name=IMAGE)
    _, token = pool_create_token(name=POOL, backend="slurm", options={"partition": slurm.partition})
    slurm.add_account("vision")
    return BridgeStack(
        slurm=slurm, server=server, bridge_token=token, api_token=make_token(user, ["read", "jobs:write"]), tmp=tmp
    )


def running_stack(stack: BridgeStack) -> Iterator[BridgeStack]:
    stack.start_bridge()
    try:
        stack.wait(lambda: _pool_gpus(stack) >= stack.slurm.gpu_count, 60, "the pool's GPUs")
        yield stack
    finally:
        stack.kill_bridge()
        os.environ.pop("SLURM_BRIDGE_TEXT", None)


def _pool_gpus(stack: BridgeStack) -> int:
    pools = stack.api("GET", "/api/v1/pools/").json()
    return sum(len(p["gpus"]) for p in pools if p["name"] == POOL)
