"""Fixtures for the node agent's runtime tests: a throwaway dockerd and a recorder of runtime events."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dockerd import dockerd  # noqa: F401 - the session fixture, for tests/workers
from workers.runtimes.base import JobOutcome, LogStream, RuntimeEvents


class EventRecorder:
    """Collects what a runtime reports, and lets a test wait for it without sleeping blindly."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.started: dict[int, str] = {}
        self.logs: dict[int, list[tuple[LogStream, str]]] = defaultdict(list)
        self.outcomes: dict[int, list[JobOutcome]] = defaultdict(list)

    @property
    def events(self) -> RuntimeEvents:
        return RuntimeEvents(on_started=self._started, on_log=self._log, on_exit=self._exit)

    def _started(self, job_id: int, handle: str) -> None:
        with self._cond:
            self.started[job_id] = handle
            self._cond.notify_all()

    def _log(self, job_id: int, stream: LogStream, line: str) -> None:
        with self._cond:
            self.logs[job_id].append((stream, line))
            self._cond.notify_all()

    def _exit(self, outcome: JobOutcome) -> None:
        with self._cond:
            self.outcomes[outcome.job_id].append(outcome)
            self._cond.notify_all()

    def _wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout=timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def wait_exit(self, job_id: int, timeout: float = 20.0) -> JobOutcome:
        self._wait_for(lambda: bool(self.outcomes.get(job_id)), timeout, f"job {job_id} to exit")
        return self.outcomes[job_id][0]

    def wait_started(self, job_id: int, timeout: float = 20.0) -> str:
        self._wait_for(lambda: job_id in self.started, timeout, f"job {job_id} to start")
        return self.started[job_id]

    def wait_line(self, job_id: int, line: str, timeout: float = 20.0) -> None:
        def seen() -> bool:
            return any(text == line for _, text in self.logs.get(job_id, []))

        self._wait_for(seen, timeout, repr(line))

    def lines(self, job_id: int, stream: LogStream = "stdout") -> list[str]:
        with self._cond:
            return [text for s, text in self.logs.get(job_id, []) if s == stream]


@pytest.fixture
def recorder() -> EventRecorder:
    return EventRecorder()


@pytest.fixture
def docker_runtime(dockerd: str, recorder: EventRecorder) -> Iterator[Callable[..., Any]]:  # noqa: F811
    """A factory of DockerRuntime instances sharing one agent label unique to the test.

    Two instances made by one test see the same containers (an agent restart); other tests' containers stay
    invisible. Whatever the test leaves on the engine is removed afterwards.
    """
    import docker

    from workers.runtimes.docker import DockerRuntime

    agent = f"t{uuid.uuid4().hex[:10]}"
    made: list[DockerRuntime] = []

    def make(**kwargs: Any) -> DockerRuntime:
        options: dict[str, Any] = {
            "base_url": dockerd,
            "events": recorder.events,
            "agent": agent,
            "name_prefix": f"{agent}-job-",
            "timeout_grace_s": 1.0,
        }
        options.update(kwargs)
        runtime = DockerRuntime(**options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()
    client = docker.DockerClient(base_url=dockerd, version="auto")
    try:
        leftovers = client.containers.list(all=True, filters={"label": f"portal.agent={agent}"}, ignore_removed=True)
        for container in leftovers:
            # NotFound or 409 "removal already in progress": the runtime's own cleanup got there first.
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
    finally:
        client.close()


@pytest.fixture
def process_state_dir(tmp_path: Path) -> Path:
    return tmp_path / "agent-state"
