"""Local-process runtime: jobs as plain subprocesses, for machines without a container engine.

No isolation beyond a new session (so the whole process group can be signalled) and an optional address-space
limit; the node's admin opts into this runtime knowingly.

The job's stdout and stderr go to files in ``state_dir``, not pipes: with pipes a restarted agent could not
read them and the job would die of SIGPIPE on its next write once the old agent is gone. One watcher thread per
job waits for its exit and reads both files between waits (every ``poll_interval_s``), line by line.
``state_dir/job-<id>.json`` records pid and start time so a restarted agent finds still-running jobs
(``list_jobs``) and adopts them by pid.

An adopted process is not the new agent's child, so waiting on it cannot give its exit status. The job therefore
runs under a small `/bin/sh` wrapper (the group leader, whose pid is recorded) that runs the command, writes its
exit status to ``state_dir/job-<id>.exit`` and exits with it: a restarted agent reads the file. The wrapper keeps a
no-op trap on TERM/INT/HUP so a cancel's SIGTERM to the group reaches the command and the wrapper still records
how it ended (traps with a command are reset in the command, which gets the default dispositions). A shell
reports death by signal N as 128 + N, the same number outcome_from_exit reports. Only when the whole group is
SIGKILLed (the grace ran out) is there no file, and then the agent that sent the signal knows why.

Memory: ``memory_mib`` becomes RLIMIT_AS (address space), set by the wrapper, so an allocation beyond it fails.
OOM detection is best-effort: a non-zero exit with the limit set and a MemoryError-like message on stderr, or
death by SIGKILL that the agent did not send, reads as reason "oom". RLIMIT_AS counts virtual memory and
CUDA reserves far more address space than it uses, so the limit is not applied to GPU jobs unless
``limit_memory_with_gpus`` is set. CPU limits are not enforced by this runtime.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from .base import (
    DEFAULT_MAX_LINE_BYTES,
    JobOutcome,
    LaunchSpec,
    LineSplitter,
    LogStream,
    RuntimeEvents,
    RuntimeJob,
    WatchedJob,
    WatcherRuntime,
    adopted_deadline,
    default_path,
    gpu_env,
    launch_error,
    outcome_from_exit,
    safe_call,
    signal_exit_code,
    utcnow,
)

logger = logging.getLogger(__name__)

_STATE_FILE = re.compile(r"job-(\d+)\.json")
_SHELL = "/bin/sh"
# $1: where the exit status goes; $2: the address-space limit in KiB (0: none), set by the shell's `ulimit -v`
# (RLIMIT_AS, soft and hard) for itself and so for the job; the rest: the job's argv, run as given (no word
# splitting, no globbing), and through `exec` so that a program named like a shell builtin (echo, test, kill) is
# the program, not the builtin. The limit is set here rather than by a preexec_fn in the agent: any preexec_fn
# makes Python fork the agent instead of vfork, which costs the agent CPU and start latency in proportion to its
# memory on every job.
_WRAPPER = (
    'f=$1; m=$2; shift 2; if [ "$m" != 0 ]; then ulimit -v "$m" || { printf "125\\n" > "$f"; exit 125; }; fi; '
    'trap : TERM INT HUP; (exec "$@"); c=$?; printf "%s\\n" "$c" > "$f"; exit "$c"'
)
# What allocation failures print in the runtimes jobs commonly use (Python, C++, libc/perror, shells).
_OOM_MARKERS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "out of memory", "Out of memory")
# How much of one log file a wake-up reads before looking at the process again (a job printing faster than that
# is read on the next wake, which comes at once): keeps the deadline and the exit noticed under a flood of output.
_READ_PER_WAKE = 4 * 1024 * 1024
_FINAL_READ_S = 10.0


@dataclass
class _Job(WatchedJob):
    pid: int = 0
    start_ticks: int | None = None
    proc: subprocess.Popen[bytes] | None = None  # None for an adopted process (not our child)
    started_at: datetime | None = None
    memory_limited: bool = False
    gpu_uuids: tuple[str, ...] = ()
    gpu_memory_mib: int = 0
    exited: threading.Event = field(default_factory=threading.Event)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))


@dataclass
class _LogFile:
    """One of a job's output files, read from where the last read stopped, split into lines."""

    stream: LogStream
    splitter: LineSplitter
    file: Any = None  # None: the file could not be opened (removed under us); reads return nothing

    @classmethod
    def open(cls, path: Path, stream: LogStream, max_line_bytes: int, *, from_end: bool) -> _LogFile:
        log = cls(stream=stream, splitter=LineSplitter(max_line_bytes))
        try:
            log.file = open(path, "rb")  # noqa: SIM115 - held while the job runs, closed by close()
        except OSError:
            return log
        if from_end:
            log.file.seek(0, os.SEEK_END)
        return log

    more: bool = False  # the last read stopped at its limit, not at the end of the file

    def read(self, limit: int) -> list[str]:
        """The complete lines written since the last read, from at most ~`limit` bytes."""
        lines: list[str] = []
        self.more = False
        if self.file is None:
            return lines
        taken = 0
        while taken < limit:
            chunk = self.file.read(65536)
            if not chunk:
                return lines
            taken += len(chunk)
            lines.extend(self.splitter.feed(chunk))
        self.more = True
        return lines

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def proc_stat(pid: int, proc: Path = Path("/proc")) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from field 3 (state) on, or None if the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields are counted after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None if gone.

    Stored with the pid so a recycled pid is never mistaken for the job (and never signalled).
    """
    fields = proc_stat(pid)
    try:
        if fields is None or fields[0] == b"Z":  # a zombie has finished; only its parent has not reaped it yet
            return None
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class ProcessRuntime(WatcherRuntime[_Job]):
    """Runs jobs as local subprocesses; see ``Runtime`` in base.py for the contract.

    ``base_env`` is the whole environment a job starts from (default: PATH, LANG, HOME only); the agent's own
    environment is not inherited because it holds the node's broker credentials.
    """

    kind = "process"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str],
        events: RuntimeEvents | None = None,
        base_env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_grace_s: float = 10.0,
        keep_exited: bool = False,
        limit_memory_with_gpus: bool = False,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        poll_interval_s: float = 0.1,
    ) -> None:
        super().__init__(
            events=events, timeout_grace_s=timeout_grace_s, keep_exited=keep_exited, max_line_bytes=max_line_bytes
        )
        self._state_dir = Path(state_dir)
        self._state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._base_env = dict(
            base_env
            if base_env is not None
            else {"PATH": default_path(), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/")}
        )
        self._cwd = cwd
        self._limit_memory_with_gpus = limit_memory_with_gpus
        self._poll_s = poll_interval_s

    # -- the Runtime contract (launch, stop, adopt, close: WatcherRuntime) ---------------------------------

    def list_jobs(self) -> list[RuntimeJob]:
        jobs = []
        for path in sorted(self._state_dir.glob("job-*.json")):
            match = _STATE_FILE.fullmatch(path.name)
            record = self._read_state(path)
            if match is None or record is None:
                continue
            job_id = int(match.group(1))
            watched = self._watched(job_id)
            exit_record = record.get("exit")
            alive = exit_record is None and self._alive(record)
            exit_code = exit_record.get("exit_code") if exit_record else None
            if exit_record is None and not alive:
                exit_code = self._read_exit_code(job_id)
            jobs.append(
                RuntimeJob(
                    job_id=job_id,
                    status="running" if alive else "exited",
                    handle=f"pid:{record.get('pid')}",
                    exit_code=exit_code if isinstance(exit_code, int) else None,
                    oom_killed=bool(exit_record and exit_record.get("reason") == "oom"),
                    started_at=_parse_time(record.get("started_at")),
                    finished_at=_parse_time(exit_record.get("finished_at")) if exit_record else None,
                    watched=watched,
                    gpu_uuids=_recorded_gpus(record),
                    gpu_memory_mib=_recorded_int(record, "gpu_memory_mib"),
                )
            )
        return sorted(jobs, key=lambda j: j.job_id)

    def _new_job(self, spec: LaunchSpec) -> _Job:
        return _Job(
            job_id=spec.job_id,
            max_duration_s=spec.max_duration_s,
            gpu_uuids=tuple(spec.gpu_uuids),
            gpu_memory_mib=spec.gpu_memory_mib,
        )

    def _left_behind(self, job_id: int) -> bool:
        # A state file without a watcher is a job from before a restart: adopt it, do not start it twice.
        return self._state_path(job_id).exists()

    def _adoption(self, job_id: int) -> tuple[_Job, Callable[[], None]] | None:
        record = self._read_state(self._state_path(job_id))
        if record is None:
            return None
        job = _Job(
            job_id=job_id,
            pid=int(record.get("pid", 0)),
            start_ticks=record.get("start_ticks"),
            started=True,
            started_at=_parse_time(record.get("started_at")),
            max_duration_s=int(record.get("max_duration_s", 0)),
            memory_limited=bool(record.get("memory_limited")),
            gpu_uuids=_recorded_gpus(record),
            gpu_memory_mib=_recorded_int(record, "gpu_memory_mib"),
        )
        job.deadline = adopted_deadline(job.max_duration_s, job.started_at)
        # Decided here, not in the watcher thread: a stop() right after adopt() may kill the process before
        # that thread looks, and the job must then read as cancelled, not as "ended unwatched".
        alive = record.get("exit") is None and self._alive(record)
        return job, partial(self._watch_adopted, job, record, alive)

    # -- launching ----------------------------------------------------------------------------------------

    def _run(self, job: _Job, spec: LaunchSpec) -> None:
        if job.stop_reason is not None:
            outcome = JobOutcome(job.job_id, "cancelled", "cancelled", None, "cancelled before it started")
            self._done(job, outcome)
            return
        env = {**self._base_env, **gpu_env(spec)}
        job.memory_limited = spec.memory_mib > 0 and (not spec.gpu_uuids or self._limit_memory_with_gpus)
        limit_kib = spec.memory_mib * 1024 if job.memory_limited else 0
        stdout_path, stderr_path = self._log_paths(job.job_id)
        exit_path = self._exit_path(job.job_id)
        with contextlib.suppress(FileNotFoundError):
            exit_path.unlink()
        # The wrapper would turn a missing program into exit 127: look it up as exec would, for a launch error.
        if shutil.which(spec.command[0], path=env.get("PATH", os.defpath)) is None:
            self._remove_files(job.job_id)
            message = f"cannot execute {spec.command[0]!r}: not found, or not an executable file"
            self._done(job, launch_error(job.job_id, message))
            return
        try:
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                # A new session: signals go to the whole process group, and the job outlives an agent restart
                # (it is not in the agent's group when a supervisor signals that).
                proc = subprocess.Popen(
                    [_SHELL, "-c", _WRAPPER, "gpuportal-job", str(exit_path), str(limit_kib), *spec.command],
                    env=env,
                    cwd=self._cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            self._remove_files(job.job_id)
            message = f"cannot execute {spec.command[0]!r}: {exc.strerror or exc}"
            self._done(job, launch_error(job.job_id, message))
            return
        with job.lock:
            job.proc = proc
            job.pid = proc.pid
            job.start_ticks = process_start_ticks(proc.pid)
            job.started_at = utcnow()
        self._write_state(job, None)
        self._started(job)
        safe_call("on_started", self._events.on_started, job.job_id, f"pid:{proc.pid}")
        self._watch(job, from_end=False)

    # -- stopping -----------------------------------------------------------------------------------------

    def _stop_job(self, job: _Job) -> None:
        self._signal_group(job, signal.SIGTERM)
        if not job.exited.wait(job.stop_grace_s):
            self._signal_group(job, signal.SIGKILL)

    def _signal_group(self, job: _Job, sig: signal.Signals) -> None:
        if job.exited.is_set():
            return
        if job.proc is None and process_start_ticks(job.pid) != job.start_ticks:
            return  # the adopted pid is gone or recycled: never signal a stranger
        # The job is its own session and group leader (start_new_session), so its pid is the group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, sig)

    # -- watching -----------------------------------------------------------------------------------------

    def _watch_adopted(self, job: _Job, record: dict[str, Any], alive: bool) -> None:
        exit_record = record.get("exit")
        if exit_record is not None:
            # Exited before the last agent could report it (or its report failed): report it now.
            self._done(job, _outcome_from_record(job.job_id, exit_record))
            return
        if not alive:
            code = self._read_exit_code(job.job_id)
            outcome = outcome_from_exit(
                job.job_id,
                code,
                stop_reason=None,
                oom=False,
                message=(
                    "the process ended while no agent watched it; its exit status is unknown"
                    if code is None
                    else f"exited with code {code} while no agent watched it"
                ),
                started_at=job.started_at,
                finished_at=utcnow(),
            )
            self._done(job, outcome)
            return
        self._watch(job, from_end=True)

    def _watch(self, job: _Job, *, from_end: bool) -> None:
        # One thread per job: it waits for the exit and reads both log files between waits. (A reader thread per
        # file would be three threads, and their wake-ups, for every job: most of this runtime's CPU per short job.)
        stdout_path, stderr_path = self._log_paths(job.job_id)
        logs = [
            _LogFile.open(stdout_path, "stdout", self._max_line_bytes, from_end=from_end),
            _LogFile.open(stderr_path, "stderr", self._max_line_bytes, from_end=from_end),
        ]
        try:
            returncode = self._wait_exit(job, logs)
            exited_at = utcnow()  # before the last reads: the job's runtime (and its bill) ends here
            if self._closed.is_set():
                return
            if returncode is None:  # adopted: the wrapper wrote the status (not there if the group was SIGKILLed)
                returncode = self._read_exit_code(job.job_id)
            # The leader is gone; anything it left running in its group would hold GPUs and the log files.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, signal.SIGKILL)
            job.exited.set()
            # Read after the exit until the reads reach the ends: that is the true end of what the job printed
            # (bounded in time: a process that left the group could write on forever).
            give_up = time.monotonic() + _FINAL_READ_S
            self._read_logs(job, logs)
            while any(log.more for log in logs) and time.monotonic() < give_up:
                self._read_logs(job, logs)
            for log in logs:
                for line in log.splitter.flush():
                    self._emit_log(job, log.stream, line)
        finally:
            for log in logs:
                log.close()
        self._done(job, self._outcome(job, returncode, exited_at))

    def _read_logs(self, job: _Job, logs: list[_LogFile]) -> None:
        for log in logs:
            for line in log.read(_READ_PER_WAKE):
                self._emit_log(job, log.stream, line)

    def _wait_exit(self, job: _Job, logs: list[_LogFile]) -> int | None:
        """Wait for the process, reading its logs every poll interval: its return code if it is our child, else
        None (also when closed).

        On a pidfd where there is one, for our child too: it wakes at the exit, where Popen.wait(timeout) polls
        with sleeps of up to 50 ms (tens of milliseconds on every short job's turnaround)."""
        pidfd = _open_pidfd(job.pid)
        try:
            while not self._closed.is_set():
                self._read_logs(job, logs)
                # Output left unread (a flood): look at the process and go on reading at once.
                chunk = self._wait_chunk(job, 0.0 if any(log.more for log in logs) else self._poll_s, floor=0.0)
                if pidfd is not None:
                    readable, _, _ = select.select([pidfd], [], [], chunk)
                    if readable:
                        return job.proc.wait() if job.proc is not None else None
                    continue
                if job.proc is not None:
                    try:
                        return job.proc.wait(timeout=chunk)
                    except subprocess.TimeoutExpired:
                        continue
                elif process_start_ticks(job.pid) != job.start_ticks:
                    return None
                else:
                    self._closed.wait(chunk)
            return None
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _emit_log(self, job: _Job, stream: LogStream, line: str) -> None:
        if stream == "stderr":
            job.stderr_tail.append(line)
        super()._emit_log(job, stream, line)

    def _outcome(self, job: _Job, returncode: int | None, exited_at: datetime) -> JobOutcome:
        exit_code = signal_exit_code(returncode) if returncode is not None else None
        oom = False
        if job.memory_limited and returncode not in (None, 0) and job.stop_reason is None:
            # SIGKILL we did not send is, on a node, most likely the kernel's OOM killer (the wrapper reports the
            # command's death by SIGKILL as 137; a group killed whole reads as -9).
            oom = returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(
                marker in line for line in job.stderr_tail for marker in _OOM_MARKERS
            )
        if returncode is None and job.stop_reason is None:
            message = "adopted after an agent restart: not our child, so its exit status is unknown"
        elif job.stop_reason == "cancelled":
            message = "stopped on request"
        elif job.stop_reason == "timeout":
            message = f"exceeded max_duration_s={job.max_duration_s}"
        elif oom:
            message = "ran out of memory under its address-space limit (best-effort detection)"
        elif returncode is not None and returncode < 0:
            message = f"killed by {signal.Signals(-returncode).name}"
        else:
            message = f"exited with code {exit_code}"
        return outcome_from_exit(
            job.job_id,
            exit_code,
            stop_reason=job.stop_reason,
            oom=oom,
            message=message,
            started_at=job.started_at,
            finished_at=exited_at,
        )

    def _done(self, job: _Job, outcome: JobOutcome) -> None:
        self._finish(job, outcome, partial(self._remove_files, job.job_id))

    def _record(self, job: _Job, outcome: JobOutcome) -> None:
        if job.started:
            # Written before reporting: if the agent dies in on_exit, the next one finds the result here.
            self._write_state(job, outcome)

    # -- state files --------------------------------------------------------------------------------------

    def _state_path(self, job_id: int) -> Path:
        return self._state_dir / f"job-{job_id}.json"

    def _exit_path(self, job_id: int) -> Path:
        return self._state_dir / f"job-{job_id}.exit"

    def _read_exit_code(self, job_id: int) -> int | None:
        """The exit status the wrapper wrote, if it did (see the module docstring)."""
        try:
            text = self._exit_path(job_id).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and int(text) < 256 else None

    def _log_paths(self, job_id: int) -> tuple[Path, Path]:
        return self._state_dir / f"job-{job_id}.stdout", self._state_dir / f"job-{job_id}.stderr"

    def _write_state(self, job: _Job, outcome: JobOutcome | None) -> None:
        record: dict[str, Any] = {
            "job_id": job.job_id,
            "pid": job.pid,
            "start_ticks": job.start_ticks,
            "started_at": job.started_at.isoformat() if job.started_at else None,
            "max_duration_s": job.max_duration_s,
            "memory_limited": job.memory_limited,
            "gpus": list(job.gpu_uuids),
            "gpu_memory_mib": job.gpu_memory_mib,
            "exit": _outcome_record(outcome) if outcome is not None else None,
        }
        path = self._state_path(job.job_id)
        tmp = path.with_suffix(".tmp")
        # Write then rename: a crash mid-write must not leave a half file that hides a running job.
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def _read_state(self, path: Path) -> dict[str, Any] | None:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _remove_files(self, job_id: int) -> None:
        for path in (self._state_path(job_id), self._exit_path(job_id), *self._log_paths(job_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @staticmethod
    def _alive(record: Mapping[str, Any]) -> bool:
        pid = record.get("pid")
        return isinstance(pid, int) and pid > 0 and process_start_ticks(pid) == record.get("start_ticks")


def _open_pidfd(pid: int) -> int | None:
    # A pidfd becomes readable when the process exits, even when it is not our child (Linux 5.3+).
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _outcome_record(outcome: JobOutcome) -> dict[str, Any]:
    return {
        "state": outcome.state,
        "reason": outcome.reason,
        "exit_code": outcome.exit_code,
        "message": outcome.message,
        "started_at": outcome.started_at.isoformat() if outcome.started_at else None,
        "finished_at": outcome.finished_at.isoformat() if outcome.finished_at else None,
    }


def _outcome_from_record(job_id: int, record: Mapping[str, Any]) -> JobOutcome:
    return JobOutcome(
        job_id=job_id,
        state=record.get("state", "failed"),
        reason=record.get("reason", "exit_code"),
        exit_code=record.get("exit_code"),
        message=record.get("message", ""),
        started_at=_parse_time(record.get("started_at")),
        finished_at=_parse_time(record.get("finished_at")),
    )


__all__ = ["ProcessRuntime", "proc_stat", "process_start_ticks"]


def _recorded_gpus(record: dict[str, Any]) -> tuple[str, ...]:
    """The devices a state file names (a file from an older agent has none)."""
    gpus = record.get("gpus")
    return tuple(g for g in gpus if isinstance(g, str)) if isinstance(gpus, list) else ()


def _recorded_int(record: dict[str, Any], key: str) -> int:
    value = record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
