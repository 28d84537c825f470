"""Docker runtime: one container per job through the Docker Engine API (the ``docker`` SDK).

Each launched or adopted job gets a watcher thread (waits for the exit, enforces ``max_duration_s``, reads the
exit code and ``State.OOMKilled``, removes the container) and two log threads (stdout and stderr are followed
separately because the SDK's log stream does not say which stream a chunk came from).

Containers are labelled ``portal.job=<id>``, ``portal.managed=1`` and ``portal.agent=<agent>``: after an agent
restart ``list_jobs`` finds them on the engine and ``adopt`` resumes watching.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest, LogConfig
from docker.types import Mount as DockerMount

from .base import (
    DEFAULT_MAX_LINE_BYTES,
    LABEL_AGENT,
    LABEL_GPU_MEMORY,
    LABEL_GPUS,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_MAX_DURATION,
    JobOutcome,
    LaunchSpec,
    LineSplitter,
    LogStream,
    RuntimeEvents,
    RuntimeJob,
    WatchedJob,
    WatcherRuntime,
    adopted_deadline,
    gpu_env,
    launch_error,
    normalize_mounts,
    outcome_from_exit,
    safe_call,
    utcnow,
)

logger = logging.getLogger(__name__)

# How long a SIGKILLed, memory-limited container's OOM news may lag its exit (see _settle_oom). Only such an exit
# that the runtime did not cause waits for it; 3 s was too short for a loaded 2-core engine in CI.
OOM_SETTLE_S = 10.0

PullPolicy = Literal["never", "missing"]

_RUNNING_STATES = frozenset({"running", "paused", "restarting"})
# Short waits keep the watcher responsive to close() and to the deadline without busy polling the engine.
_WAIT_CHUNK_S = 2.0


class _LaunchFailed(Exception):
    pass


class _CancelledBeforeStart(Exception):
    pass


@dataclass
class _Job(WatchedJob):
    container_id: str | None = None
    memory_mib: int = 0
    exited_before_adopt: bool = False


def engine_message(exc: BaseException) -> str:
    """The engine's own words for a failure (what the user needs), not the SDK's HTTP wrapping."""
    if isinstance(exc, APIError) and exc.explanation:
        return str(exc.explanation)
    return str(exc)


def parse_engine_time(value: str | None) -> datetime | None:
    """Parse Docker's RFC 3339 nanosecond timestamps; the zero time ("0001-01-01...") means never."""
    if not value or value.startswith("0001-01-01"):
        return None
    text = value.rstrip("Z")
    if "." in text:
        whole, frac = text.split(".", 1)
        text = f"{whole}.{frac[:6]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=utcnow().tzinfo)


def engine_run_times(state: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    """(started, finished) of a container's State. The engine stamps StartedAt after containerd reports the task
    started, so a process that exits at once can have a FinishedAt a few hundred microseconds before it: the
    finish is never reported before the start."""
    started = parse_engine_time(state.get("StartedAt"))
    finished = parse_engine_time(state.get("FinishedAt"))
    if started is not None and finished is not None and finished < started:
        finished = started
    return started, finished


class DockerRuntime(WatcherRuntime[_Job]):
    """Runs jobs as containers; see ``Runtime`` in base.py for the contract.

    ``pull="never"`` (the default: these nodes have no registry) fails a job whose image is not on the node;
    ``"missing"`` pulls it first, giving up after ``pull_timeout_s``. ``keep_exited`` keeps containers after
    their outcome is reported (debugging). ``init`` runs Docker's tiny init as PID 1 so a job's process gets
    SIGTERM on cancel (PID 1 ignores signals it has no handler for) and zombies are reaped.
    """

    kind = "docker"

    def __init__(
        self,
        *,
        events: RuntimeEvents | None = None,
        base_url: str = "unix:///var/run/docker.sock",
        client: docker.DockerClient | None = None,
        agent: str = "default",
        pull: PullPolicy = "never",
        pull_timeout_s: float = 300.0,
        keep_exited: bool = False,
        pids_limit: int = 4096,
        timeout_grace_s: float = 10.0,
        init: bool = True,
        shm_size_mib: int | None = None,
        log_max_size: str | None = "100m",
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        api_timeout_s: float = 60.0,
        name_prefix: str = "portal-job-",
    ) -> None:
        if pull not in ("never", "missing"):
            raise ValueError(f"unknown pull policy {pull!r}")
        super().__init__(
            events=events, timeout_grace_s=timeout_grace_s, keep_exited=keep_exited, max_line_bytes=max_line_bytes
        )
        self._owns_client = client is None
        # version="auto": the nodes run whatever Docker their distribution ships (20.10 speaks API 1.41).
        # A bigger pool because every running job holds up to three streaming connections.
        self._client = client or docker.DockerClient(
            base_url=base_url, version="auto", timeout=int(api_timeout_s), max_pool_size=64
        )
        self._agent = agent
        self._pull = pull
        self._pull_timeout_s = pull_timeout_s
        self._pids_limit = pids_limit
        self._init = init
        self._shm_size_mib = shm_size_mib
        self._log_max_size = log_max_size
        self._name_prefix = name_prefix

    @property
    def client(self) -> docker.DockerClient:
        return self._client

    # -- the Runtime contract (launch, stop, adopt: WatcherRuntime) ----------------------------------------

    def list_jobs(self) -> list[RuntimeJob]:
        jobs = []
        for container in self._managed_containers():
            listed = self._listed(container)
            if listed is not None:
                jobs.append(listed)
        return sorted(jobs, key=lambda j: j.job_id)

    def close(self) -> None:
        super().close()
        if self._owns_client:
            self._client.close()

    def _new_job(self, spec: LaunchSpec) -> _Job:
        return _Job(job_id=spec.job_id, max_duration_s=spec.max_duration_s, memory_mib=spec.memory_mib)

    def _adoption(self, job_id: int) -> tuple[_Job, Callable[[], None]] | None:
        container = self._find(job_id)
        if container is None:
            return None
        state = container.attrs.get("State", {})
        job = _Job(
            job_id=job_id, container_id=container.id, max_duration_s=_int_label(container.labels, LABEL_MAX_DURATION)
        )
        job.deadline = adopted_deadline(job.max_duration_s, parse_engine_time(state.get("StartedAt")))
        job.started = state.get("Status") in _RUNNING_STATES
        job.exited_before_adopt = not job.started
        return job, partial(self._watch_adopted, job, container)

    def _may_signal(self, job: _Job) -> bool:
        return job.container_id is not None

    def _ended_unwatched(self, job: _Job) -> bool:
        return job.exited_before_adopt

    # -- launching -------------------------------------------------------------------------------------

    def _run(self, job: _Job, spec: LaunchSpec) -> None:
        try:
            container = self._start_container(job, spec)
        except _LaunchFailed as exc:
            self._finish(job, launch_error(job.job_id, str(exc)))
            return
        except _CancelledBeforeStart:
            outcome = JobOutcome(
                job.job_id,
                "cancelled",
                "cancelled",
                None,
                "cancelled before it started",
                finished_at=utcnow(),
            )
            self._finish(job, outcome)
            return
        except Exception as exc:  # an unexpected SDK failure must still produce an outcome
            logger.exception("launching job %s failed", job.job_id)
            self._finish(job, launch_error(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        self._watch(job, container, tail="all")

    def _start_container(self, job: _Job, spec: LaunchSpec) -> Container:
        if self._pull == "missing":
            self._ensure_image(spec.image)
        if job.stop_reason is not None:
            raise _CancelledBeforeStart
        try:
            # create + start rather than containers.run: run() pulls on ImageNotFound by itself, and with no
            # registry that pull is where a launch would hang.
            container = self._client.containers.create(**self.create_kwargs(spec))
        except DockerException as exc:
            raise _LaunchFailed(engine_message(exc)) from exc
        job.container_id = container.id
        if job.stop_reason is not None:
            self._remove(container)
            raise _CancelledBeforeStart
        try:
            container.start()
        except DockerException as exc:
            # A failed start (e.g. GPUs requested without the NVIDIA runtime) leaves the container in Created
            # state; it would otherwise sit there and show up in list_jobs forever.
            self._remove(container)
            raise _LaunchFailed(engine_message(exc)) from exc
        self._started(job)
        safe_call("on_started", self._events.on_started, job.job_id, container.id)
        return container

    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        """The arguments for ``containers.create``; public so tests and a dry run can inspect them."""
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": list(spec.command),
            "environment": gpu_env(spec),
            "labels": {
                LABEL_JOB: str(spec.job_id),
                LABEL_MANAGED: "1",
                LABEL_AGENT: self._agent,
                LABEL_MAX_DURATION: str(spec.max_duration_s),
                LABEL_GPUS: ",".join(spec.gpu_uuids),
                LABEL_GPU_MEMORY: str(spec.gpu_memory_mib),
            },
            "name": f"{self._name_prefix}{spec.job_id}",
            "detach": True,
            "network_mode": spec.network,
            "privileged": False,
            "security_opt": ["no-new-privileges"],
            "pids_limit": self._pids_limit,
            "init": self._init,
            # Only the spec's mounts (already checked by the policy): type=bind fails on a missing source
            # instead of letting the engine create directories on the host as root.
            "mounts": [
                DockerMount(target=m.container_path, source=m.host_path, type="bind", read_only=m.read_only)
                for m in normalize_mounts(spec.mounts)
            ],
            # No ulimits: the engine's hard nofile limit here is 20000 and asking for more fails the start.
        }
        if spec.memory_mib > 0:
            # memswap == mem: with swap allowed the job would page instead of being OOM-killed, and the OOM
            # reason would never show.
            kwargs["mem_limit"] = f"{spec.memory_mib}m"
            kwargs["memswap_limit"] = f"{spec.memory_mib}m"
        if spec.cpus > 0:
            kwargs["nano_cpus"] = round(spec.cpus * 1e9)
        if self._shm_size_mib:
            kwargs["shm_size"] = f"{self._shm_size_mib}m"
        if self._log_max_size:
            # A chatty job must not fill the node's disk with its json log.
            kwargs["log_config"] = LogConfig(
                type=LogConfig.types.JSON, config={"max-size": self._log_max_size, "max-file": "2"}
            )
        if spec.use_nvidia_runtime and spec.gpu_uuids:
            kwargs["device_requests"] = [DeviceRequest(device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]])]
        return kwargs

    def _ensure_image(self, image: str) -> None:
        try:
            self._client.images.get(image)
            return
        except ImageNotFound:
            pass
        except DockerException as exc:
            raise _LaunchFailed(engine_message(exc)) from exc
        errors: list[BaseException] = []

        def pull() -> None:
            try:
                self._client.images.pull(image)
            except Exception as exc:
                errors.append(exc)

        # The SDK's timeout is per read, not for the whole pull; a thread with a join deadline bounds it.
        puller = threading.Thread(target=pull, name=f"docker-pull-{image}", daemon=True)
        puller.start()
        puller.join(self._pull_timeout_s)
        if puller.is_alive():
            raise _LaunchFailed(f"pulling {image} took longer than {self._pull_timeout_s:g} s")
        if errors:
            raise _LaunchFailed(f"pulling {image} failed: {engine_message(errors[0])}")

    # -- stopping --------------------------------------------------------------------------------------

    def _stop_job(self, job: _Job) -> None:
        assert job.container_id is not None
        try:
            container = self._client.containers.get(job.container_id)
            # The engine does SIGTERM, grace, SIGKILL itself; its grace is whole seconds.
            container.stop(timeout=max(0, math.ceil(job.stop_grace_s)))
        except NotFound:
            pass
        except DockerException:
            logger.exception("stopping job %s failed", job.job_id)

    # -- watching --------------------------------------------------------------------------------------

    def _watch_adopted(self, job: _Job, container: Container) -> None:
        if job.started:
            self._watch(job, container, tail=0)
            return
        try:
            container.reload()
        except NotFound:
            self._finish(job, _vanished(job.job_id))
            return
        if parse_engine_time(container.attrs["State"].get("StartedAt")) is None:
            outcome = launch_error(job.job_id, "the container was created but never started (agent restarted?)")
            self._finish(job, outcome, partial(self._remove, container))
            return
        # Exited while no agent watched: the event log is all there is to read (no waiting for late news).
        outcome = self._outcome(job, container, oom=self._oom_killed(container))
        self._finish(job, outcome, partial(self._remove, container))

    def _watch(self, job: _Job, container: Container, *, tail: int | Literal["all"]) -> None:
        pumps = [
            threading.Thread(
                target=self._pump_logs,
                args=(job.job_id, container, stream, tail),
                name=f"docker-log-{job.job_id}-{stream}",
                daemon=True,
            )
            for stream in ("stdout", "stderr")
        ]
        for pump in pumps:
            pump.start()
        exited = self._wait_exit(job, container)
        if self._closed.is_set():
            return
        if not exited:
            self._finish(job, _vanished(job.job_id))
            return
        for pump in pumps:
            # The streams end when the container stops; the bound only guards against a wedged engine.
            pump.join(timeout=10)
        try:
            container.reload()
            oom = self._settle_oom(job, container)
        except NotFound:
            self._finish(job, _vanished(job.job_id))
            return
        self._finish(job, self._outcome(job, container, oom=oom), partial(self._remove, container))

    def _settle_oom(self, job: _Job, container: Container) -> bool:
        """Whether the kernel's OOM killer ended the container, giving late news time to land.

        dockerd records containerd's exit and OOM events on separate paths: when the exit is handled first, the
        waiter wakes with ``OOMKilled`` false, and the flag is set a moment later or, on dockerd 20.10 under load,
        never (rarely, with busy neighbours); the engine still logs the container's ``oom``
        event, so that is asked too. Only a SIGKILL exit (137) of a memory-limited container that we did not stop
        can be that case, so only that case looks further, and for at most ``OOM_SETTLE_S``.
        """
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            return True
        limited = bool(container.attrs.get("HostConfig", {}).get("Memory"))
        if job.stop_reason is not None or state.get("ExitCode") != 137 or not limited:
            return False
        deadline = time.monotonic() + OOM_SETTLE_S
        while True:
            if self._oom_event_logged(container):
                return True
            if time.monotonic() >= deadline or self._closed.is_set():
                return False
            self._closed.wait(0.2)
            container.reload()
            if container.attrs.get("State", {}).get("OOMKilled"):
                return True

    def _oom_killed(self, container: Container) -> bool:
        """The engine's flag, or for the case it can miss (a memory-limited container's exit 137) its event log."""
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            return True
        limited = bool(container.attrs.get("HostConfig", {}).get("Memory"))
        return state.get("ExitCode") == 137 and limited and self._oom_event_logged(container)

    def _oom_event_logged(self, container: Container) -> bool:
        """Whether the engine's event log holds an ``oom`` event of this container (since it started)."""
        started = parse_engine_time(container.attrs.get("State", {}).get("StartedAt"))
        # The API filters by whole seconds; a second's margin on each side.
        since = int(started.timestamp()) - 1 if started is not None else int(time.time()) - 3600
        try:
            stream = self._client.api.events(
                since=since,
                until=int(time.time()) + 1,
                filters={"container": container.id, "event": "oom"},
                decode=True,
            )
            try:
                return any(True for _ in stream)
            finally:
                stream.close()
        except (requests.exceptions.RequestException, DockerException) as exc:
            logger.warning("could not read the engine's events for container %s: %s", container.id, exc)
            return False

    def _wait_exit(self, job: _Job, container: Container) -> bool:
        """Block until the container exits (True), vanishes (False) or the runtime closes."""
        while not self._closed.is_set():
            chunk = self._wait_chunk(job, _WAIT_CHUNK_S, floor=0.05)
            now = time.monotonic()
            try:
                container.wait(timeout=chunk)
                return True
            except NotFound:
                return False
            except (requests.exceptions.RequestException, DockerException) as exc:
                # A read timeout is the normal way a chunk ends; a fast failure means the engine is away.
                if time.monotonic() - now < chunk / 2:
                    logger.warning("waiting for job %s: %s", job.job_id, exc)
                    self._closed.wait(1.0)
        return False

    def _pump_logs(self, job_id: int, container: Container, stream: LogStream, tail: int | Literal["all"]) -> None:
        splitter = LineSplitter(self._max_line_bytes)
        try:
            chunks = container.logs(
                stream=True, follow=True, stdout=stream == "stdout", stderr=stream == "stderr", tail=tail
            )
            for chunk in chunks:
                if self._closed.is_set():
                    return
                for line in splitter.feed(chunk):
                    safe_call("on_log", self._events.on_log, job_id, stream, line)
        except (requests.exceptions.RequestException, DockerException) as exc:
            if not self._closed.is_set():
                logger.warning("log stream %s of job %s ended: %s", stream, job_id, exc)
        for line in splitter.flush():
            safe_call("on_log", self._events.on_log, job_id, stream, line)

    def _outcome(self, job: _Job, container: Container, *, oom: bool | None = None) -> JobOutcome:
        """The job's outcome from the exited container; `oom` overrides the engine's flag (see _settle_oom)."""
        state = container.attrs.get("State", {})
        exit_code = state.get("ExitCode")
        oom = bool(state.get("OOMKilled")) if oom is None else oom
        started_at, finished_at = engine_run_times(state)
        outcome = outcome_from_exit(
            job.job_id,
            exit_code if isinstance(exit_code, int) else None,
            stop_reason=job.stop_reason,
            oom=oom,
            started_at=started_at,
            finished_at=finished_at,
        )
        memory = container.attrs.get("HostConfig", {}).get("Memory") or 0
        messages = {
            "cancelled": "stopped on request",
            "timeout": f"exceeded max_duration_s={job.max_duration_s}",
            "oom": f"killed by the kernel OOM killer (memory limit {memory // (1024 * 1024)} MiB)",
            "exit_code": f"exited with code {exit_code}",
        }
        message = messages.get(outcome.reason, "")
        if state.get("Error"):
            message = f"{message}; engine: {state['Error']}"
        return JobOutcome(**{**outcome.__dict__, "message": message})

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except NotFound:
            pass
        except DockerException:
            logger.exception("removing container %s failed", container.id)

    # -- engine lookups --------------------------------------------------------------------------------

    def _label_filter(self, job_id: int | None = None) -> dict[str, list[str]]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_AGENT}={self._agent}"]
        if job_id is not None:
            labels.append(f"{LABEL_JOB}={job_id}")
        return {"label": labels}

    def _managed_containers(self, job_id: int | None = None) -> list[Container]:
        # ignore_removed: a container our own watcher removes between list and inspect is not an error.
        return list(self._client.containers.list(all=True, filters=self._label_filter(job_id), ignore_removed=True))

    def _find(self, job_id: int) -> Container | None:
        found = self._managed_containers(job_id)
        return found[0] if found else None

    def _listed(self, container: Container) -> RuntimeJob | None:
        try:
            job_id = int(container.labels.get(LABEL_JOB, ""))
        except ValueError:
            return None
        state = container.attrs.get("State", {})
        running = state.get("Status") in _RUNNING_STATES
        started_at, finished_at = engine_run_times(state)
        exit_code = state.get("ExitCode")
        watched = self._watched(job_id)
        return RuntimeJob(
            job_id=job_id,
            status="running" if running else "exited",
            handle=container.id,
            # A container that never started has ExitCode 0 in the engine; that is not a success.
            exit_code=None if running or started_at is None or not isinstance(exit_code, int) else exit_code,
            oom_killed=not running and self._oom_killed(container),
            started_at=started_at,
            finished_at=None if running else finished_at,
            watched=watched,
            gpu_uuids=tuple(g for g in container.labels.get(LABEL_GPUS, "").split(",") if g),
            gpu_memory_mib=max(0, _int_label(container.labels, LABEL_GPU_MEMORY)),
        )


def _int_label(labels: dict[str, str], name: str) -> int:
    try:
        return int(labels.get(name, "0"))
    except ValueError:
        return 0


def _vanished(job_id: int) -> JobOutcome:
    return JobOutcome(
        job_id,
        "failed",
        "exit_code",
        None,
        "the container disappeared (removed outside the agent)",
        finished_at=utcnow(),
    )


__all__ = ["DockerRuntime", "PullPolicy", "engine_message", "parse_engine_time"]
