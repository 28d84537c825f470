"""Job commands of the node agent: `agent.launch_job` and `agent.cancel_job`, and the job reports to the portal.

`install(app, agent)` is called once by workers/agent_app.install_tasks, before the agent's Celery worker starts.
No Django here: a GPU node runs users' code and holds no database credentials.

Runtime: `--runtime docker|process|auto` (AgentConfig.runtime when the agent has that option, else the
GPUPORTAL_RUNTIME environment variable; default auto = docker if a Docker engine answers, else the local-process
runtime). Docker engine: GPUPORTAL_DOCKER_HOST or DOCKER_HOST (default unix:///var/run/docker.sock).

Node policy (workers/runtimes/policy.py re-checks every launch; the portal checked too):
GPUPORTAL_ALLOWED_IMAGES (comma-separated patterns, default "*": the portal's allow-list decides),
GPUPORTAL_MOUNT_PREFIXES / GPUPORTAL_WRITABLE_MOUNT_PREFIXES (host directories jobs may mount; default none),
GPUPORTAL_NVIDIA_RUNTIME=1 on real GPU nodes with the NVIDIA Container Toolkit (GPUs passed as device requests).

Reports (queue `control`, through agent.link; node and token added there):

| task | when | body |
|---|---|---|
| `jobs.report_started` | a flush START_REPORT_DELAY_S after the start, or with its first lines | job_id, handle, at |
| `jobs.report_logs` | every 200 ms or 50 lines | batches [{job_id, epoch, first, lines [[stream, text, ts]]}] |
| `jobs.report_exit` | once per job | job_id, state, reason, exit_code, message, finished_at, log_total (*) |
| `jobs.report_inventory` | at start (adopting) and every 30 s | jobs [{job_id, status: running/launching/exited}] |

(*) plus handle and started_at when the job ended before its start was reported: a job shorter than
START_REPORT_DELAY_S that prints nothing costs the portal one message, not two (CI smoke jobs, jobs that fail at
once: with two messages each, the portal's worker was the bottleneck of a stream of such jobs).

Reconciliation: at start the runner lists the jobs its runtime finds (containers labelled for this agent, or the
process runtime's state files) and adopts them all: running ones are watched again, ended ones report their exit.
Then the inventory tells the portal what runs here; the portal marks jobs it expected but the node lacks as lost
and asks the node to stop jobs the portal has already ended. Jobs whose exit was reported in the last
EXITED_LISTED_S are listed as `exited`: the portal's worker may take the inventory before that exit report (two
worker processes, or a replay after a broker outage), and must not call such a job lost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from celery import Celery, signals

from workers.agent_host import AgentHost, command_body
from workers.gpu.mps import DEFAULT_BINARY as DEFAULT_MPS_BINARY
from workers.gpu.mps import MpsControl, MpsError, ShareLimits
from workers.gpu.simulated import SimulatedBackend
from workers.jobmem import JobMemory, RunningJob
from workers.runtimes.base import JobOutcome, LaunchSpec, LogStream, Runtime, RuntimeEvents
from workers.runtimes.policy import ContainerPolicy, PolicyViolation, validate_launch_request

logger = logging.getLogger("workers.agent.jobs")

FLUSH_INTERVAL_S = 0.2
START_REPORT_DELAY_S = 0.5  # the portal shows "starting" that much longer; see the table above
FLUSH_LINES = 50
INVENTORY_EVERY_S = 30.0
EXITED_LISTED_S = 2 * INVENTORY_EVERY_S  # see "Reconciliation" above
EXIT_SEND_WAIT_S = 5.0
MAX_BUFFERED_LINES_PER_JOB = 20_000  # a job printing faster than the broker takes it loses its oldest lines


class Sender(Protocol):
    def send(self, task: str, body: dict[str, Any], *, expires: float | None = None, critical: bool = True) -> None: ...

    def pending(self) -> int: ...


# --- Choosing a runtime --------------------------------------------------------------------------------------


def docker_url() -> str:
    return os.environ.get("GPUPORTAL_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def docker_answers(url: str, timeout_s: float = 3.0) -> bool:
    try:
        import docker

        client = docker.DockerClient(base_url=url, version="auto", timeout=int(max(1, timeout_s)))
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def resolve_runtime_kind(requested: str, url: str) -> str:
    """ "docker" or "process" for --runtime auto|docker|process."""
    if requested not in ("auto", "docker", "process"):
        raise ValueError(f"--runtime must be auto, docker or process, not {requested!r}")
    if requested != "auto":
        return requested
    return "docker" if docker_answers(url) else "process"


def node_policy(gpu_uuids: list[str] | None) -> ContainerPolicy:
    def env_list(name: str, default: str = "") -> tuple[str, ...]:
        return tuple(p.strip() for p in os.environ.get(name, default).split(",") if p.strip())

    return ContainerPolicy(
        allowed_images=env_list("GPUPORTAL_ALLOWED_IMAGES", "*"),
        mount_prefixes=env_list("GPUPORTAL_MOUNT_PREFIXES"),
        writable_mount_prefixes=env_list("GPUPORTAL_WRITABLE_MOUNT_PREFIXES"),
        use_nvidia_runtime=os.environ.get("GPUPORTAL_NVIDIA_RUNTIME", "") in ("1", "true", "yes"),
        mps=os.environ.get("GPUPORTAL_MPS", "") in ("1", "true", "yes"),
        node_gpu_uuids=gpu_uuids,
    )


def make_runtime(kind: str, *, agent_name: str, events: RuntimeEvents, state_dir: Path, url: str) -> Runtime:
    if kind == "docker":
        from workers.runtimes.docker import DockerRuntime

        return DockerRuntime(
            events=events, base_url=url, agent=agent_name, name_prefix=f"portal-{agent_name}-job-", timeout_grace_s=5.0
        )
    from workers.runtimes.process import ProcessRuntime

    return ProcessRuntime(state_dir=state_dir, events=events, timeout_grace_s=5.0)


# --- The runner ----------------------------------------------------------------------------------------------


class _RecentIds:
    """A set of job ids that forgets the oldest beyond `limit` (an agent runs for months)."""

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._ids: dict[int, None] = {}

    def add(self, job_id: int) -> None:
        self._ids[job_id] = None
        if len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids


@dataclass
class _LogState:
    epoch: str
    next_seq: int = 1
    buffer: list[list[Any]] = field(default_factory=list)
    first_buffered: int = 1


class JobRunner:
    """Launches and stops jobs through one runtime and reports what happens to the portal."""

    def __init__(
        self,
        *,
        sender: Sender,
        policy: ContainerPolicy,
        runtime_factory: Callable[[RuntimeEvents], Runtime],
        on_gpus: Callable[[int, list[str], bool, int], None] | None = None,
        mps: MpsControl | None = None,
        gpu_index: Mapping[str, int] | None = None,
        gpu_memory: Mapping[str, int] | None = None,
    ) -> None:
        self.sender = sender
        self.policy = policy
        self.on_gpus = on_gpus
        # With a policy that says the node runs MPS: shares get the daemon's limits (gpu/mps.py).
        self.mps_limits = ShareLimits(mps, gpu_index or {}, gpu_memory or {}) if mps is not None else None
        self._lock = threading.Lock()
        self._logs: dict[int, _LogState] = {}
        self._launching: set[int] = set()
        self._running: set[int] = set()
        self._gpus: dict[int, list[str]] = {}
        self._handles: dict[int, str] = {}  # running jobs: the runtime's handle (workers/jobmem.py reads it)
        self._cancelled_early = _RecentIds()
        self._started: dict[int, tuple[str, float, float]] = {}  # not reported yet: (handle, time, monotonic)
        self._reported = _RecentIds()  # ended here: a launch re-sent after the end must not run it again
        self._exited: dict[int, float] = {}  # exit reported: monotonic time, listed in inventories for a while
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.runtime = runtime_factory(
            RuntimeEvents(on_started=self._on_started, on_log=self._on_log, on_exit=self._on_exit)
        )

    # -- life cycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._flush_loop, "jobs-log-flusher"), (self._inventory_loop, "jobs-inventory")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Agent shutdown: flush logs, stop watching (the jobs keep running; the next agent adopts them)."""
        self._stop.set()
        self._wake.set()
        self.flush()
        self.runtime.close()

    def stop_jobs(self, grace_s: float = 3.0) -> list[int]:
        """Cancel every job of this agent and wait (grace_s + 5 s at most) for their exits to be reported.

        For an agent that takes its jobs with it when it stops (`--stop-jobs-on-exit`: the local agent of
        `make run`); a real node's agent leaves them running and adopts them when it comes back."""
        with self._lock:
            ids = sorted(self._running | self._launching)
        for job_id in ids:
            try:
                self.runtime.stop(job_id, grace_s=grace_s)
            except Exception:
                logger.exception("stopping job %s at shutdown failed", job_id)
        deadline = time.monotonic() + grace_s + 5.0
        while time.monotonic() < deadline:
            with self._lock:
                if not (self._running | self._launching) & set(ids):
                    break
            time.sleep(0.05)
        if ids:
            logger.info("stopped %d job(s) at shutdown: %s", len(ids), ids)
        return ids

    def reconcile(self) -> list[int]:
        """Adopt every job the runtime finds (after an agent restart); returns their ids."""
        adopted: list[int] = []
        try:
            listed = self.runtime.list_jobs()
        except Exception:
            logger.exception("listing the runtime's jobs failed")
            return adopted
        for job in listed:
            if job.watched:
                continue
            running = job.status == "running"
            with self._lock:
                self._logs[job.job_id] = _LogState(epoch=uuid.uuid4().hex[:12])
                if running:
                    self._running.add(job.job_id)
                    self._handles[job.job_id] = job.handle
                    if job.gpu_uuids:  # its devices, for the memory attribution and the release at its end
                        self._gpus[job.job_id] = list(job.gpu_uuids)
            if running and job.gpu_uuids and self.on_gpus is not None:
                self.on_gpus(job.job_id, list(job.gpu_uuids), True, job.gpu_memory_mib)
            if self.runtime.adopt(job.job_id):
                adopted.append(job.job_id)
                logger.info("adopted job %s (%s)", job.job_id, job.status)
        self.send_inventory()
        return adopted

    # -- commands ------------------------------------------------------------------------------------------

    def launch(self, request: dict[str, Any]) -> bool:
        """Check the request against the node policy and launch it; a refusal is reported as launch_error."""
        job_id = request.get("job_id")
        try:
            spec = validate_launch_request(request, self.policy)
        except PolicyViolation as exc:
            logger.warning("job %s refused by the node policy: %s", job_id, exc)
            if isinstance(job_id, int) and not isinstance(job_id, bool):
                self._report_exit_now(job_id, "failed", "launch_error", None, f"refused by the node's policy: {exc}")
            return False
        with self._lock:
            if spec.job_id in self._cancelled_early or spec.job_id in self._reported:
                return False
            known = spec.job_id in self._launching or spec.job_id in self._running
            if not known:
                self._launching.add(spec.job_id)
                self._logs[spec.job_id] = _LogState(epoch=uuid.uuid4().hex[:12])
                self._gpus[spec.job_id] = list(spec.gpu_uuids)
        if known:
            return False  # a re-sent launch: this one is already under way
        try:
            self._limit_share(spec)
        except MpsError as exc:
            logger.warning("job %s: MPS limits not set: %s", spec.job_id, exc)
            self._report_exit_now(spec.job_id, "failed", "launch_error", None, f"MPS limits could not be set: {exc}")
            return False
        try:
            launched = self.runtime.launch(spec)
        except Exception as exc:
            logger.exception("launching job %s failed", spec.job_id)
            self._report_exit_now(spec.job_id, "failed", "launch_error", None, f"{type(exc).__name__}: {exc}")
            return False
        if not launched:
            # The runtime already has it (a state file from before a restart): watch it rather than start a copy.
            self.runtime.adopt(spec.job_id)
        with self._lock:
            cancelled_meanwhile = spec.job_id in self._cancelled_early
        if cancelled_meanwhile:
            # A cancel arrived between our bookkeeping and the runtime knowing the job: stop it now.
            self.runtime.stop(spec.job_id, grace_s=0.0)
        if self.on_gpus is not None:
            self.on_gpus(spec.job_id, list(spec.gpu_uuids), True, spec.gpu_memory_mib)
        return launched

    def _limit_share(self, spec: LaunchSpec) -> None:
        """On an MPS node, have the control daemon hold a job on a share to it before the job can connect, or lift
        the limit for a whole-GPU job on a GPU whose shares were limited before (gpu/mps.py: ShareLimits)."""
        if self.mps_limits is not None and spec.mps:
            self.mps_limits.before_launch(spec.job_id, list(spec.gpu_uuids), spec.gpu_share, spec.gpu_memory_mib)

    def cancel(self, job_id: int, grace_s: float) -> bool:
        """SIGTERM, grace, SIGKILL. A job this node never launched is reported cancelled and never started."""
        if self.runtime.stop(job_id, grace_s=grace_s):
            return True
        with self._lock:
            launching = job_id in self._launching
            self._cancelled_early.add(job_id)
        if not launching:
            self._report_exit_now(job_id, "cancelled", "cancelled", None, "cancelled before it started on the node")
        return False

    # -- runtime callbacks (watcher threads) ---------------------------------------------------------------

    def _on_started(self, job_id: int, handle: str) -> None:
        # Reported by a flush START_REPORT_DELAY_S later (or with the job's first log lines): a job that ends
        # before then carries its start in the exit report instead, one message to the portal rather than two.
        with self._lock:
            self._launching.discard(job_id)
            self._running.add(job_id)
            self._handles[job_id] = handle
            self._started[job_id] = (handle[:200], time.time(), time.monotonic())

    def _on_log(self, job_id: int, stream: LogStream, line: str) -> None:
        with self._lock:
            state = self._logs.get(job_id)
            if state is None:
                state = self._logs[job_id] = _LogState(epoch=uuid.uuid4().hex[:12])
            if not state.buffer:
                state.first_buffered = state.next_seq
            state.buffer.append([stream, line, round(time.time(), 3)])
            state.next_seq += 1
            if len(state.buffer) > MAX_BUFFERED_LINES_PER_JOB:
                drop = len(state.buffer) - MAX_BUFFERED_LINES_PER_JOB
                del state.buffer[:drop]
                state.first_buffered += drop
            full = len(state.buffer) >= FLUSH_LINES
        if full:
            self._wake.set()

    def _on_exit(self, outcome: JobOutcome) -> None:
        self.flush(outcome.job_id, started=False)
        if self.mps_limits is not None:
            self.mps_limits.forget(outcome.job_id)
        with self._lock:
            started = self._started.pop(outcome.job_id, None)
            state = self._logs.pop(outcome.job_id, None)
            self._launching.discard(outcome.job_id)
            self._running.discard(outcome.job_id)
            gpus = self._gpus.pop(outcome.job_id, [])
            self._handles.pop(outcome.job_id, None)
            self._reported.add(outcome.job_id)
            self._exited[outcome.job_id] = time.monotonic()
        total = state.next_seq - 1 if state is not None else 0
        finished = outcome.finished_at.timestamp() if outcome.finished_at else time.time()
        self.sender.send(
            "jobs.report_exit",
            {
                "job_id": outcome.job_id,
                "state": outcome.state,
                "reason": outcome.reason,
                "exit_code": outcome.exit_code,
                "message": outcome.message[:8000],
                "finished_at": finished,
                "log_total": total,
                **({"handle": started[0], "started_at": started[1]} if started else {}),
            },
        )
        if self.on_gpus is not None and gpus:
            self.on_gpus(outcome.job_id, gpus, False, 0)
        # The runtime removes the container once this returns: give the sender a moment to get the report out,
        # so an agent killed right now leaves the container (and the outcome) for its successor, not nothing.
        deadline = time.monotonic() + EXIT_SEND_WAIT_S
        while self.sender.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        logger.info("job %s %s (%s, exit %s)", outcome.job_id, outcome.state, outcome.reason, outcome.exit_code)

    def _report_exit_now(self, job_id: int, state: str, reason: str, exit_code: int | None, message: str) -> None:
        if self.mps_limits is not None:
            self.mps_limits.forget(job_id)
        with self._lock:
            self._launching.discard(job_id)
            self._reported.add(job_id)
            self._exited[job_id] = time.monotonic()
        self.sender.send(
            "jobs.report_exit",
            {
                "job_id": job_id,
                "state": state,
                "reason": reason,
                "exit_code": exit_code,
                "message": message[:8000],
                "finished_at": time.time(),
                "log_total": 0,
            },
        )

    # -- logs ----------------------------------------------------------------------------------------------

    def flush(self, job_id: int | None = None, *, started: bool = True) -> int:
        """Send due start reports, then buffered lines (of one job, or all) as one `jobs.report_logs`.

        A start is due START_REPORT_DELAY_S after it, or now when lines of the job go out (the portal takes
        reports in order: a job's lines never arrive before its start). Returns how many lines were sent."""
        batches: list[dict[str, Any]] = []
        starts: list[tuple[int, str, float]] = []
        with self._lock:
            items = [(job_id, self._logs.get(job_id))] if job_id is not None else list(self._logs.items())
            if started:
                due = time.monotonic() - START_REPORT_DELAY_S
                printing = {jid for jid, state in items if state is not None and state.buffer}
                wanted = [job_id] if job_id is not None else list(self._started)
                for jid in wanted:
                    entry = self._started.get(jid)
                    if entry is not None and (entry[2] <= due or jid in printing):
                        del self._started[jid]
                        starts.append((jid, entry[0], entry[1]))
            for jid, state in items:
                if state is None or not state.buffer:
                    continue
                batches.append(
                    {"job_id": jid, "epoch": state.epoch, "first": state.first_buffered, "lines": state.buffer}
                )
                state.buffer = []
                state.first_buffered = state.next_seq
        for jid, handle, at in starts:
            self.sender.send("jobs.report_started", {"job_id": jid, "handle": handle, "at": at})
        if batches:
            self.sender.send("jobs.report_logs", {"batches": batches})
        return sum(len(b["lines"]) for b in batches)

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            try:
                self.flush()
            except Exception:
                logger.exception("sending logs failed")

    def running_jobs(self) -> list[RunningJob]:
        """The running jobs with their devices and handles, for the GPU memory attribution (workers/jobmem.py)."""
        with self._lock:
            return [
                RunningJob(job_id, tuple(self._gpus.get(job_id, ())), self._handles.get(job_id, ""))
                for job_id in self._running
            ]

    # -- inventory -----------------------------------------------------------------------------------------

    def inventory(self) -> list[dict[str, Any]]:
        with self._lock:
            running = sorted(self._running)
            launching = sorted(self._launching - self._running)
            horizon = time.monotonic() - EXITED_LISTED_S
            for job_id in [j for j, at in self._exited.items() if at < horizon]:
                del self._exited[job_id]
            exited = sorted(set(self._exited) - self._running - self._launching)
        return (
            [{"job_id": j, "status": "running"} for j in running]
            + [{"job_id": j, "status": "launching"} for j in launching]
            + [{"job_id": j, "status": "exited"} for j in exited]
        )

    def send_inventory(self) -> None:
        self.sender.send("jobs.report_inventory", {"jobs": self.inventory(), "complete": True}, critical=False)

    def _inventory_loop(self) -> None:
        while not self._stop.wait(INVENTORY_EVERY_S):
            try:
                self.send_inventory()
            except Exception:
                logger.exception("sending the inventory failed")


# --- Installing into the agent -----------------------------------------------------------------------------


def _simulated_gpus(agent: AgentHost) -> Callable[[int, list[str], bool, int], None] | None:
    """With simulated GPUs, make their telemetry follow the jobs (busy while a job runs, idle after). A job on a
    share keeps to the memory budget it is told, as the job environment asks of it (runtimes/base.py)."""
    backend = agent.backend
    if agent.backend_kind != "simulated" or not isinstance(backend, SimulatedBackend):
        return None

    def follow(job_id: int, gpus: list[str], running: bool, memory_mib: int) -> None:
        for gpu in gpus:
            try:
                if running:
                    backend.assign(gpu, f"job-{job_id}", memory_mib=memory_mib)
                else:
                    backend.release(gpu, f"job-{job_id}")
            except Exception:
                logger.debug("simulated GPU %s does not follow job %s", gpu, job_id, exc_info=True)

    return follow


def install(app: Celery, agent: AgentHost) -> JobRunner:
    """Register `agent.launch_job` / `agent.cancel_job` on the agent's app, and the job runner's start and stop on
    the worker's; returns the runner."""
    requested = agent.cfg.runtime or os.environ.get("GPUPORTAL_RUNTIME", "auto")
    url = docker_url()
    kind = resolve_runtime_kind(requested, url)
    base = agent.cfg.state_dir or Path(tempfile.gettempdir()) / f"gpuportal-agent-{agent.cfg.name}"
    state_dir = Path(base) / "jobs"
    # A GPU's MIG instances are devices of this node too (a job is given exactly its instance).
    policy = node_policy([*agent.gpu_by_uuid, *(d.uuid for g in agent.gpu_by_uuid.values() for d in g.mig_devices)])
    mps: MpsControl | None = None
    if policy.mps and kind == "docker":
        # A container reaches the daemon only through its pipe directory and the host's IPC namespace, which the
        # portal does not give containers: shares there are time-sliced, and jobs are told so.
        logger.warning("GPUPORTAL_MPS is ignored with the docker runtime: shares run time-sliced")
        policy = dataclasses.replace(policy, mps=False)
    elif policy.mps:
        mps = MpsControl(
            os.environ.get("GPUPORTAL_MPS_CONTROL", DEFAULT_MPS_BINARY),
            pipe_dir=os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or None,
        )
    runner = JobRunner(
        sender=agent.link,
        policy=policy,
        mps=mps,
        gpu_index={uuid: gpu.index for uuid, gpu in agent.gpu_by_uuid.items()},
        gpu_memory={uuid: gpu.memory_mib for uuid, gpu in agent.gpu_by_uuid.items()},
        runtime_factory=lambda events: make_runtime(
            kind, agent_name=agent.cfg.name, events=events, state_dir=state_dir, url=url
        ),
        on_gpus=_simulated_gpus(agent),
    )
    simulated = agent.backend if isinstance(agent.backend, SimulatedBackend) else None
    agent.sampler.annotate = JobMemory(
        runner.running_jobs,
        job_of_pid=simulated.job_of_pid if simulated is not None else None,
        uid_of_pid=simulated.uid_of_pid if simulated is not None else None,
        process_activity=mps is None,  # under MPS the server's process may carry its clients' work (jobmem.py)
    ).annotate
    logger.info("jobs run with the %s runtime%s", kind, f" ({url})" if kind == "docker" else f" (state {state_dir})")

    def launch_job(envelope: Any) -> bool:
        body = command_body(agent, "agent.launch_job", envelope)
        if body is None:
            return False
        return runner.launch(body)

    def cancel_job(envelope: Any) -> bool:
        body = command_body(agent, "agent.cancel_job", envelope)
        if body is None:
            return False
        job_id, grace = body.get("job_id"), body.get("grace_s", 10.0)
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not isinstance(grace, int | float):
            logger.warning("agent.cancel_job refused: malformed body")
            return False
        return runner.cancel(job_id, float(min(max(grace, 0.0), 300.0)))

    # shared=False: a shared task is added to every Celery app created later in the process, bound to this
    # agent's runner; a second agent in one process (tests, a multi-node simulator) would run the first one's.
    app.task(name="agent.launch_job", ignore_result=True, shared=False)(launch_job)
    app.task(name="agent.cancel_job", ignore_result=True, shared=False)(cancel_job)

    def start_runner(**kwargs: Any) -> None:
        # After the link is up (Agent.start_background ran before the worker), so the reports can leave.
        runner.start()
        runner.reconcile()

    def stop_runner(**kwargs: Any) -> None:
        if agent.cfg.stop_jobs_on_exit:
            runner.stop_jobs()
        runner.stop()

    signals.worker_ready.connect(start_runner, weak=False)
    signals.worker_shutdown.connect(stop_runner, weak=False)

    return runner
