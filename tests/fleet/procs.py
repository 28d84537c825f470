"""Real processes for fleet integration tests: the portal's Celery worker (with beat) and node agents."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from tests.conftest import REPO, subprocess_env


def clean_fleet_redis() -> None:
    """Forget live telemetry and the Celery queues these tests use (our own Redis database)."""
    from apps.core.redis import get_redis

    r = get_redis()
    doomed = [k for pattern in ("fleet:*", "node.*") for k in r.scan_iter(match=pattern, count=1000)]
    doomed += [b"control", b"portal"]
    for i in range(0, len(doomed), 500):
        r.delete(*doomed[i : i + 500])


class Proc:
    """A child process whose output goes to a log file (read it when a test fails)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self._fh = log.open("ab")
        # Its own session (process group), so a kill reaches what it started too: a Celery worker's embedded beat
        # (-B) is a child that a SIGKILL of the worker alone would leave running after the suite.
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def kill(self) -> None:
        """SIGKILL the process and everything it started (a crash, as the fault tests want it)."""
        if self.alive():
            self._kill_group()
            self.proc.wait(10)
        self._kill_group()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a clean shutdown), SIGKILL after `timeout`; whatever it left behind in its group goes too."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.proc.wait(10)
        self._kill_group()
        self._fh.close()
        return self.proc.returncode

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_portal_worker(tmp: Path, **env: str) -> Proc:
    """`celery -A portal worker -Q control,portal -B` (solo pool: one process) on the test database."""
    argv = [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", "control,portal", "-P", "solo"]
    argv += ["-n", f"fleet-test-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    argv += ["-B", "-s", str(tmp / "celerybeat-schedule"), "-l", "INFO"]
    return Proc(argv, subprocess_env(**env), tmp / "portal-worker.log")


def start_ingest(tmp: Path, **env: str) -> Proc:
    """`manage.py ingest_telemetry`: the consumer of the agents' telemetry stream."""
    return Proc([sys.executable, "manage.py", "ingest_telemetry"], subprocess_env(**env), tmp / "ingest.log")


def start_agent(
    tmp: Path,
    name: str,
    token: str,
    *,
    gpus: int = 2,
    models: str = "A100-80GB,H100-80GB",
    heartbeat: float = 1.0,
    seed: int = 0,
    telemetry_via: str = "stream",
    extra: list[str] | None = None,
) -> Proc:
    argv = [sys.executable, "-m", "workers.agent", "--name", name, "--backend", "simulated", "--gpus", str(gpus)]
    argv += ["--models", models, "--seed", str(seed), "--heartbeat", str(heartbeat), "--simulate-busy", "1"]
    argv += ["--state-dir", str(tmp / f"agent-{name}"), "--concurrency", "2", "--telemetry-via", telemetry_via]
    argv += extra or []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "DJANGO"))}
    env.update(
        {"GPUPORTAL_NODE_TOKEN": token, "GPUPORTAL_BROKER_URL": settings.REDIS.redis_py_url, "PYTHONUNBUFFERED": "1"}
    )
    return Proc(argv, env, tmp / f"agent-{name}.log")


def wait_for(check: Callable[[], Any], timeout: float, what: str, procs: list[Proc] = ()) -> Any:  # type: ignore[assignment]
    """Poll `check` until it returns something truthy; on timeout fail with the processes' last output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    logs = "\n\n".join(f"--- {p.log.name}\n{p.tail()}" for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        yield
    finally:
        for p in reversed(procs):
            p.stop()
