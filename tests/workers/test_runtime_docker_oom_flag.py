"""The OOM flag that lands after the exit (dockerd handles containerd's exit and OOM events on separate paths).

A real engine shows the race only under load, so the engine's side is a stand-in container whose inspect answers
change over time, the way dockerd's did in CI: exit 137 with ``OOMKilled`` false, then true a moment later.
"""

from __future__ import annotations

import time
from typing import Any

from workers.runtimes.docker import DockerRuntime, _Job


class LateOomContainer:
    """``reload()`` sees ``OOMKilled`` turn true after ``flag_after`` reloads (never, if None)."""

    def __init__(self, *, exit_code: int = 137, memory: int = 16 << 20, flag_after: int | None = 2) -> None:
        self.reloads = 0
        self.exit_code = exit_code
        self.memory = memory
        self.flag_after = flag_after
        self.attrs: dict[str, Any] = {}
        self._refresh()

    def _refresh(self) -> None:
        oom = self.flag_after is not None and self.reloads >= self.flag_after
        self.attrs = {
            "State": {"ExitCode": self.exit_code, "OOMKilled": oom, "StartedAt": "", "FinishedAt": ""},
            "HostConfig": {"Memory": self.memory},
        }

    def reload(self) -> None:
        self.reloads += 1
        self._refresh()


def runtime() -> DockerRuntime:
    # The client is never called: the methods under test only read the container they are given.
    return DockerRuntime(client=object())  # type: ignore[arg-type]


def test_a_late_oom_flag_makes_the_outcome_oom() -> None:
    rt, job, container = runtime(), _Job(job_id=1), LateOomContainer(flag_after=3)
    rt._settle_oom_flag(job, container)  # type: ignore[arg-type]
    outcome = rt._outcome(job, container)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "oom", 137)
    assert "OOM killer (memory limit 16 MiB)" in outcome.message


def test_without_the_flag_a_sigkill_stays_an_exit_code_after_a_bounded_wait(monkeypatch: Any) -> None:
    monkeypatch.setattr("workers.runtimes.docker.OOM_SETTLE_S", 0.3)
    rt, job, container = runtime(), _Job(job_id=1), LateOomContainer(flag_after=None)
    started = time.monotonic()
    rt._settle_oom_flag(job, container)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2
    outcome = rt._outcome(job, container)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 137)


def test_other_exits_do_not_wait() -> None:
    rt = runtime()
    for job, container in [
        (_Job(job_id=1), LateOomContainer(exit_code=1)),  # not a SIGKILL
        (_Job(job_id=2), LateOomContainer(memory=0)),  # no memory limit: not the kernel's memory cgroup
        (_Job(job_id=3, stop_reason="cancelled"), LateOomContainer()),  # our own stop
    ]:
        rt._settle_oom_flag(job, container)  # type: ignore[arg-type]
        assert container.reloads == 0
