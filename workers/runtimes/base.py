"""Shared vocabulary of the node agent's job runtimes (Docker, local process).

Plain Python 3.10+, no Django: GPU nodes run the agent without the portal's code base.

The agent drives a runtime through four calls (``launch``, ``stop``, ``list_jobs``, ``adopt``); it reports
back through callbacks injected at construction (``RuntimeEvents``). Callbacks run on the runtime's watcher
threads, never on the caller's thread, so they must be thread-safe and quick (hand off to a queue).

``WatcherRuntime`` holds what both runtimes do alike (the job table, launch/stop/adopt, stop requests, the
deadline, reporting each outcome once); each runtime adds how a job starts, is stopped, watched and found again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import ClassVar, Generic, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

logger = logging.getLogger(__name__)

OutcomeState = Literal["succeeded", "failed", "cancelled"]
OutcomeReason = Literal["exit_code", "oom", "timeout", "cancelled", "launch_error"]
LogStream = Literal["stdout", "stderr"]
ListedStatus = Literal["running", "exited"]

# Labels put on every container (and mirrored in the process runtime's state files) so a restarted agent finds
# its jobs on the engine instead of trusting its own (lost) memory.
LABEL_JOB = "portal.job"
LABEL_MANAGED = "portal.managed"
LABEL_AGENT = "portal.agent"
LABEL_MAX_DURATION = "portal.max_duration_s"
# The job's devices and a share's memory budget: a restarted agent still knows which GPUs or MIG instances an
# adopted job holds (its memory attribution, workers/jobmem.py) and what a simulated GPU should show for it.
LABEL_GPUS = "portal.gpus"
LABEL_GPU_MEMORY = "portal.gpu_memory_mib"

# Docker's json-file driver splits lines at 16 KiB; the process runtime uses the same bound.
DEFAULT_MAX_LINE_BYTES = 16 * 1024

# Set by the agent, never taken from the job's env: they decide which GPUs the job sees. An image or a user
# setting NVIDIA_VISIBLE_DEVICES=all would expose every GPU of the node under the NVIDIA runtime.
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})

# With these set NCCL aborts a hung collective instead of hanging until max_duration; multi-GPU jobs get
# them unless the job chose otherwise.
NCCL_DEFAULTS: Mapping[str, str] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "1"}


class Mount(NamedTuple):
    """A bind mount; a plain ``(host_path, container_path, read_only)`` tuple works as well."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass
class LaunchSpec:
    """Everything a runtime needs to start one job; built by ``policy.validate_launch_request``.

    ``cpus`` <= 0 and ``memory_mib`` <= 0 mean no limit, ``max_duration_s`` <= 0 means no deadline (the portal
    always sends all three). ``use_nvidia_runtime`` is node configuration (a real GPU node with the NVIDIA
    Container Toolkit), not something a job asks for. The process runtime ignores ``image``, ``mounts`` and
    ``network``.
    """

    job_id: int
    image: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpu_uuids: list[str] = field(default_factory=list)
    cpus: float = 0.0
    memory_mib: int = 0
    max_duration_s: int = 0
    mounts: list[Mount] = field(default_factory=list)
    use_nvidia_runtime: bool = False
    network: str = "none"
    # A share of its one GPU (1.0: the whole GPU or MIG instance) and the GPU memory that share may use; ``mps``
    # is node configuration (NVIDIA's MPS control daemon runs there), as ``use_nvidia_runtime`` is.
    gpu_share: float = 1.0
    gpu_memory_mib: int = 0
    mps: bool = False


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended, as reported through ``RuntimeEvents.on_exit``.

    ``exit_code`` is None when there is none (launch_error) or it cannot be known (a process adopted after an
    agent restart is not our child). Killed by a signal reads as 128 + signal number, as Docker reports it.
    """

    job_id: int
    state: OutcomeState
    reason: OutcomeReason
    exit_code: int | None
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class RuntimeJob:
    """A job found on the host by ``Runtime.list_jobs`` (from engine labels or the process state dir).

    ``status`` "running" jobs can be adopted (watching resumes); "exited" ones carry what the engine kept
    (``exit_code`` None if unknown, ``oom_killed``); adopting an exited one reports its outcome and cleans up.
    ``watched`` says whether this runtime instance already watches it (no need to adopt).
    """

    job_id: int
    status: ListedStatus
    handle: str
    exit_code: int | None = None
    oom_killed: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    watched: bool = False
    gpu_uuids: tuple[str, ...] = ()  # the GPUs or MIG instances it was launched on (empty: not recorded)
    gpu_memory_mib: int = 0  # a share's memory budget (0: none)


def _ignore_started(job_id: int, handle: str) -> None:
    return None


def _ignore_log(job_id: int, stream: LogStream, line: str) -> None:
    return None


def _ignore_exit(outcome: JobOutcome) -> None:
    return None


@dataclass(frozen=True)
class RuntimeEvents:
    """Callbacks a runtime calls from its watcher threads.

    - ``on_started(job_id, handle)``: the container/process runs; handle is the container id or ``pid:<n>``.
    - ``on_log(job_id, stream, line)``: one line without its newline, at most ``max_line_bytes`` (longer lines
      arrive in pieces), in order within a stream; all lines come before ``on_exit``.
    - ``on_exit(outcome)``: exactly once per launched or adopted job, after which the runtime forgets it.
      If it raises, the runtime keeps the exited container/state file so ``list_jobs`` finds it again.
    """

    on_started: Callable[[int, str], None] = _ignore_started
    on_log: Callable[[int, LogStream, str], None] = _ignore_log
    on_exit: Callable[[JobOutcome], None] = _ignore_exit


@runtime_checkable
class Runtime(Protocol):
    """What the agent calls. Every method returns quickly; results come through ``RuntimeEvents``."""

    def launch(self, spec: LaunchSpec) -> bool:
        """Start the job and its watcher in the background; False if this job id is already known here."""
        ...

    def stop(self, job_id: int, grace_s: float = 10.0) -> bool:
        """Cancel: SIGTERM, ``grace_s`` seconds, SIGKILL; on_exit then says cancelled. False if unknown."""
        ...

    def list_jobs(self) -> list[RuntimeJob]:
        """The jobs of this agent present on the host, running or exited, for reconciliation."""
        ...

    def adopt(self, job_id: int) -> bool:
        """Resume watching a job found by ``list_jobs`` (logs from now on, then on_exit). False if absent."""
        ...

    def close(self) -> None:
        """Stop watching without touching the jobs (agent shutdown/restart): no further callbacks."""
        ...


def utcnow() -> datetime:
    # timezone.utc, not datetime.UTC: the agent must run on Python 3.10, which lacks the alias.
    return datetime.now(timezone.utc)  # noqa: UP017


def gpu_env(spec: LaunchSpec) -> dict[str, str]:
    """The job's environment as the runtime must set it: job env, NCCL defaults, then the GPU variables.

    The GPU variables are set last and always (empty when no GPU) so neither the job's env nor the image's
    ENV can widen the set of visible GPUs.
    """
    env = {k: v for k, v in spec.env.items() if k not in RESERVED_ENV}
    if len(spec.gpu_uuids) > 1:
        for name, value in NCCL_DEFAULTS.items():
            env.setdefault(name, value)
    visible = ",".join(spec.gpu_uuids)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    shared = share_env(spec)
    if "PYTORCH_CUDA_ALLOC_CONF" in shared:
        shared["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf(env.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    env.update(shared)
    return env


def alloc_conf(own: str) -> str:
    """PyTorch's allocator options for a job on a share: the job's own (``max_split_size_mb:128``, ...) kept, with
    ``expandable_segments:True`` added unless the job chose that option itself."""
    options = [o.strip() for o in own.split(",") if o.strip()]
    if not any(o.partition(":")[0].strip() == "expandable_segments" for o in options):
        options.append("expandable_segments:True")
    return ",".join(options)


def share_env(spec: LaunchSpec) -> dict[str, str]:
    """What a job holding a share of a GPU is told, and on an MPS node held to.

    With MPS the client limits apply: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (device 0 of what the job sees, in MB)
    and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; a client's variables can only lower what the control daemon sets
    per client (``set_default_device_pinned_mem_limit``, ``set_default_active_thread_percentage``), so the node's
    daemon must carry the same defaults. Without MPS the GPU is time-sliced: nothing enforces the memory budget;
    the job is told it (``GPUPORTAL_GPU_MEMORY_MIB``, the MPS-style variable for tools that read it) and PyTorch's
    caching allocator is asked to give freed memory back (``expandable_segments``, added to the job's own
    allocator options by ``gpu_env``) rather than hold it from the other tenants. ``GPUPORTAL_GPU_ISOLATION``
    says which ("mps" or "none"). Empty for a whole GPU."""
    if spec.gpu_share >= 1.0 or len(spec.gpu_uuids) != 1:
        return {}
    env = {
        "GPUPORTAL_GPU_SHARE": f"{spec.gpu_share:g}",
        "GPUPORTAL_GPU_ISOLATION": "mps" if spec.mps else "none",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    if spec.gpu_memory_mib > 0:
        env["GPUPORTAL_GPU_MEMORY_MIB"] = str(spec.gpu_memory_mib)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={spec.gpu_memory_mib}M"
    if spec.mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(spec.gpu_share * 100)))
    return env


def normalize_mounts(mounts: Iterable[Mount | tuple[str, str, bool]]) -> list[Mount]:
    return [Mount(str(m[0]), str(m[1]), bool(m[2])) for m in mounts]


class LineSplitter:
    """Turns a byte stream into bounded lines: a line longer than ``max_bytes`` is cut into pieces.

    Bytes are decoded as UTF-8 with replacement so a job printing binary never breaks the agent; a cut can
    land inside a multi-byte character, which then shows as U+FFFD on both sides.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._max = max(1, max_bytes)
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[str]:
        self._buf.extend(data)
        while True:
            nl = self._buf.find(b"\n", 0, self._max + 1)
            if nl >= 0:
                piece = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
            elif len(self._buf) >= self._max:
                piece = bytes(self._buf[: self._max])
                del self._buf[: self._max]
            else:
                return
            yield _decode(piece)

    def flush(self) -> Iterator[str]:
        if self._buf:
            piece = bytes(self._buf)
            self._buf.clear()
            yield _decode(piece)


def _decode(piece: bytes) -> str:
    return piece.rstrip(b"\r").decode("utf-8", errors="replace")


def safe_call(what: str, fn: Callable[..., None], *args: object) -> bool:
    """Call an agent callback; a failing callback must not kill the watcher thread. True if it returned."""
    try:
        fn(*args)
    except Exception:
        logger.exception("runtime callback %s failed", what)
        return False
    return True


def signal_exit_code(returncode: int) -> int:
    """subprocess reports death by signal N as -N; Docker and shells say 128 + N, used everywhere."""
    return 128 - returncode if returncode < 0 else returncode


def outcome_from_exit(
    job_id: int,
    exit_code: int | None,
    *,
    stop_reason: OutcomeReason | None,
    oom: bool,
    message: str = "",
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
) -> JobOutcome:
    """One precedence for both runtimes: our own cancel, then our timeout, then OOM, then the exit code.

    OOM counts only with a non-zero exit: the kernel may kill a child of the job while the job itself recovers
    and succeeds, and Docker's OOMKilled flag is set by any OOM event in the container's cgroup.
    """
    if stop_reason == "cancelled":
        state: OutcomeState = "cancelled"
        reason: OutcomeReason = "cancelled"
    elif stop_reason == "timeout":
        state, reason = "failed", "timeout"
    elif oom and exit_code != 0:
        state, reason = "failed", "oom"
    elif exit_code == 0:
        state, reason = "succeeded", "exit_code"
    else:
        state, reason = "failed", "exit_code"
    return JobOutcome(
        job_id=job_id,
        state=state,
        reason=reason,
        exit_code=exit_code,
        message=message,
        started_at=started_at,
        finished_at=finished_at,
    )


def launch_error(job_id: int, message: str) -> JobOutcome:
    return JobOutcome(
        job_id=job_id,
        state="failed",
        reason="launch_error",
        exit_code=None,
        message=message,
        finished_at=utcnow(),
    )


def default_path() -> str:
    return os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def adopted_deadline(max_duration_s: int, started_at: datetime | None) -> float | None:
    """The ``time.monotonic()`` deadline of a job found running after a restart: its start is a wall-clock time."""
    if max_duration_s <= 0 or started_at is None:
        return None
    elapsed = (utcnow() - started_at).total_seconds()
    return time.monotonic() + max_duration_s - elapsed


@dataclass
class WatchedJob:
    """What the shared watcher logic keeps of one job; each runtime adds its own handle on it.

    ``started``: the container or process runs (or ran), so a stop can be sent to it. A stop requested before
    that is remembered in ``stop_reason`` and applied by the launcher as soon as the job starts.
    """

    job_id: int
    max_duration_s: int = 0
    started: bool = False
    deadline: float | None = None  # time.monotonic() value
    stop_reason: OutcomeReason | None = None
    stop_grace_s: float = 10.0
    stopping: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


J = TypeVar("J", bound=WatchedJob)


class WatcherRuntime(ABC, Generic[J]):
    """The bookkeeping of the ``Runtime`` contract that both runtimes share: one record per launched or adopted
    job, stop requests (our cancel, our deadline), and exactly one ``on_exit`` per job.

    A subclass says how a job starts (``_run``, on its own thread), how one is found again after a restart
    (``_adoption``), how it is stopped (``_stop_job``, on its own thread since it blocks for the grace period),
    and watches it, ending with ``_finish``.
    """

    kind: ClassVar[str]  # names the runtime's threads

    def __init__(
        self,
        *,
        events: RuntimeEvents | None,
        timeout_grace_s: float,
        keep_exited: bool,
        max_line_bytes: int,
    ) -> None:
        self._events = events or RuntimeEvents()
        self._timeout_grace_s = timeout_grace_s
        self._keep_exited = keep_exited
        self._max_line_bytes = max_line_bytes
        self._jobs: dict[int, J] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # -- what a runtime provides ----------------------------------------------------------------------------

    @abstractmethod
    def _new_job(self, spec: LaunchSpec) -> J:
        """The runtime's record of a job about to be launched."""

    @abstractmethod
    def _run(self, job: J, spec: LaunchSpec) -> None:
        """Start the job, call ``_started`` once it runs, watch it, ``_finish`` it (launch errors too)."""

    @abstractmethod
    def _adoption(self, job_id: int) -> tuple[J, Callable[[], None]] | None:
        """The record of a job found on the host and the watch to run for it on a new thread, or None."""

    @abstractmethod
    def _stop_job(self, job: J) -> None:
        """SIGTERM, ``job.stop_grace_s``, SIGKILL; may block that long."""

    def _left_behind(self, job_id: int) -> bool:
        """Whether the host has this job from before a restart (a launch must then adopt, not start it)."""
        return False

    def _may_signal(self, job: J) -> bool:
        """Whether a stop can reach the started job yet (the container may still lack its id)."""
        return True

    def _ended_unwatched(self, job: J) -> bool:
        """Whether the job had already ended on its own when it was adopted: a stop then changes nothing."""
        return False

    def _record(self, job: J, outcome: JobOutcome) -> None:
        """Keep the outcome on the host before reporting it (for the next agent if this one dies in on_exit)."""
        return None

    # -- the Runtime contract -------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> bool:
        job = self._new_job(spec)
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("runtime is closed")
            # Broker messages are delivered at least once: a repeated launch must not start a second copy.
            if spec.job_id in self._jobs or self._left_behind(spec.job_id):
                return False
            self._jobs[spec.job_id] = job
        self._spawn(f"{self.kind}-job-{spec.job_id}", self._run, job, spec)
        return True

    def stop(self, job_id: int, grace_s: float = 10.0) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            # After a restart the portal may cancel a job this instance has not adopted yet.
            if not self.adopt(job_id):
                return False
            with self._lock:
                job = self._jobs.get(job_id)
            if job is None:
                return True
        self._request_stop(job, "cancelled", grace_s)
        return True

    def adopt(self, job_id: int) -> bool:
        with self._lock:
            if job_id in self._jobs:
                return True
        found = self._adoption(job_id)
        if found is None:
            return False
        job, watch = found
        with self._lock:
            if job_id in self._jobs:
                return True
            self._jobs[job_id] = job
        self._spawn(f"{self.kind}-adopt-{job_id}", watch)
        return True

    def close(self) -> None:
        self._closed.set()

    # -- shared steps ---------------------------------------------------------------------------------------

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _watched(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._jobs

    def _started(self, job: J) -> None:
        """The job runs: its deadline starts now, and a stop requested while it was starting is sent."""
        with job.lock:
            job.started = True
            if job.max_duration_s > 0:
                job.deadline = time.monotonic() + job.max_duration_s
            pending = job.stop_reason is not None and not job.stopping
            if pending:
                job.stopping = True
        if pending:
            self._spawn_stopper(job)

    def _request_stop(self, job: J, reason: OutcomeReason, grace_s: float) -> None:
        with job.lock:
            if self._ended_unwatched(job):
                return  # it ended on its own before anyone asked; its outcome stays what it was
            if job.stop_reason is None:
                job.stop_reason = reason
                job.stop_grace_s = grace_s
            if not job.started or job.stopping or not self._may_signal(job):
                return  # not started yet: the launcher sees stop_reason and stops it (or never starts it)
            job.stopping = True
        self._spawn_stopper(job)

    def _spawn_stopper(self, job: J) -> None:
        # A stop blocks for the whole grace period; stop() must return at once.
        self._spawn(f"{self.kind}-stop-{job.job_id}", self._stop_job, job)

    def _wait_chunk(self, job: J, chunk: float, *, floor: float) -> float:
        """How long the watcher may wait before looking again: ``chunk``, shortened to the job's deadline. Past
        the deadline this asks for the timeout stop (once) and the job is then waited for like any other."""
        if job.deadline is None or job.stop_reason is not None:
            return chunk
        now = time.monotonic()
        if now >= job.deadline:
            self._request_stop(job, "timeout", self._timeout_grace_s)
            return chunk
        return min(chunk, max(floor, job.deadline - now))

    def _emit_log(self, job: J, stream: LogStream, line: str) -> None:
        safe_call("on_log", self._events.on_log, job.job_id, stream, line)

    def _finish(self, job: J, outcome: JobOutcome, cleanup: Callable[[], None] | None = None) -> None:
        """Report the outcome once and forget the job; ``cleanup`` (removing what the job left on the host) runs
        only once the report went through, so a failed report leaves the job for ``list_jobs`` to find again."""
        if self._closed.is_set():
            # Shutting down: the next agent instance finds the job on the host and reports it.
            return
        self._record(job, outcome)
        reported = safe_call("on_exit", self._events.on_exit, outcome)
        if cleanup is not None and reported and not self._keep_exited:
            cleanup()
        with self._lock:
            self._jobs.pop(job.job_id, None)
