"""The OOM flag that lands after the exit, or never (dockerd handles containerd's exit and OOM events on separate
paths; on 20.10 under load the flag can stay false while the engine still logs the container's ``oom`` event).

A real engine shows the race only under load, so the engine's side is a stand-in container whose inspect answers
change over time, the way dockerd's did in CI (exit 137 with ``OOMKilled`` false, then true a moment later, or
never), and a stand-in client whose event log holds an ``oom`` event or not. `test_runtime_docker.py` asks a real
engine's event log.
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
        self.id = "c0ffee"
        self.attrs = {
            "State": {"ExitCode": self.exit_code, "OOMKilled": oom, "StartedAt": "", "FinishedAt": ""},
            "HostConfig": {"Memory": self.memory},
        }

    def reload(self) -> None:
        self.reloads += 1
        self._refresh()


class Stream(list):  # type: ignore[type-arg]
    def close(self) -> None:
        pass


class EventLog:
    """The client's `api.events`, holding an `oom` event of the container after `after` queries (never: None)."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.queries: list[dict[str, Any]] = []

    def events(self, **kwargs: Any) -> Stream:
        self.queries.append(kwargs)
        found = self.after is not None and len(self.queries) > self.after
        return Stream([{"status": "oom", "id": "c0ffee"}] if found else [])


class Client:
    def __init__(self, oom_event_after: int | None = None) -> None:
        self.api = EventLog(oom_event_after)


def runtime(oom_event_after: int | None = None) -> DockerRuntime:
    return DockerRuntime(client=Client(oom_event_after))  # type: ignore[arg-type]


def test_a_late_oom_flag_makes_the_outcome_oom() -> None:
    rt, job, container = runtime(), _Job(job_id=1), LateOomContainer(flag_after=3)
    oom = rt._settle_oom(job, container)  # type: ignore[arg-type]
    outcome = rt._outcome(job, container, oom=oom)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "oom", 137)
    assert "OOM killer (memory limit 16 MiB)" in outcome.message


def test_an_oom_event_without_the_flag_makes_the_outcome_oom() -> None:
    rt, job, container = runtime(oom_event_after=0), _Job(job_id=1), LateOomContainer(flag_after=None)
    started = time.monotonic()
    oom = rt._settle_oom(job, container)  # type: ignore[arg-type]
    assert time.monotonic() - started < 0.5  # already in the log: no waiting
    outcome = rt._outcome(job, container, oom=oom)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "oom", 137)
    [query] = rt._client.api.queries  # type: ignore[attr-defined]
    assert query["filters"] == {"container": "c0ffee", "event": "oom"} and query["until"] > query["since"]


def test_an_oom_event_logged_late_is_still_seen() -> None:
    rt, job, container = runtime(oom_event_after=3), _Job(job_id=1), LateOomContainer(flag_after=None)
    assert rt._settle_oom(job, container) is True  # type: ignore[arg-type]
    assert len(rt._client.api.queries) == 4  # type: ignore[attr-defined]


def test_without_flag_or_event_a_sigkill_stays_an_exit_code_after_a_bounded_wait(monkeypatch: Any) -> None:
    monkeypatch.setattr("workers.runtimes.docker.OOM_SETTLE_S", 0.5)
    rt, job, container = runtime(), _Job(job_id=1), LateOomContainer(flag_after=None)
    started = time.monotonic()
    oom = rt._settle_oom(job, container)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2
    outcome = rt._outcome(job, container, oom=oom)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 137)
    assert len(rt._client.api.queries) >= 2  # type: ignore[attr-defined]


def test_other_exits_do_not_wait_or_ask() -> None:
    rt = runtime(oom_event_after=0)
    for job, container in [
        (_Job(job_id=1), LateOomContainer(exit_code=1)),  # not a SIGKILL
        (_Job(job_id=2), LateOomContainer(memory=0)),  # no memory limit: not the kernel's memory cgroup
        (_Job(job_id=3, stop_reason="cancelled"), LateOomContainer()),  # our own stop
    ]:
        assert rt._settle_oom(job, container) is False  # type: ignore[arg-type]
        assert container.reloads == 0
    assert rt._client.api.queries == []  # type: ignore[attr-defined]


def test_a_listed_exited_container_is_oom_by_its_event_log() -> None:
    # An agent that restarts lists the containers that exited meanwhile: nobody waited on them.
    rt = runtime(oom_event_after=0)
    assert rt._oom_killed(LateOomContainer(flag_after=None)) is True  # type: ignore[arg-type]
    assert rt._oom_killed(LateOomContainer(flag_after=None, exit_code=1)) is False  # type: ignore[arg-type]
    assert runtime()._oom_killed(LateOomContainer(flag_after=None)) is False  # type: ignore[arg-type]
