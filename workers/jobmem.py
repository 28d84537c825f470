"""Which portal job uses how much memory on each GPU: the node agent's attribution of GPU processes to jobs.

Why: on a GPU split into shares, NVML's memory used is what all the share's jobs hold together, and a job that
outgrows its budget cannot be told from its neighbours. NVML lists the processes on each GPU with the memory each
one holds (read every ~10 s); the agent knows which job each process belongs to:
- process runtime: a job is its own session (started with `start_new_session`), so a process belongs to the job
  whose leader's pid is its session id (`/proc/<pid>/stat`), whatever it forked;
- docker runtime: a container's processes are in cgroups whose path holds the container's id
  (`/proc/<pid>/cgroup`, both cgroup v1 and v2 layouts);
- simulated GPUs: the backend knows the pid it gave each job's load (`job_of_pid`);
- a MIG instance holds one job, so a job on an instance uses what the instance reports, even when NVML gives the
  processes of a GPU in MIG mode without their memory.

NVML's pids are the host's: an agent run in a container of its own needs the host's PID namespace for this.
A process that belongs to no job of this agent (a user's shell, another tool) is left out.

A running job with no process on its GPU holds nothing there (no CUDA context: it is still loading its data, or
it gave the GPU up), and says so with 0 MiB (and 0% where the GPU's processes' utilization was read): a job on a
share that computes nothing beside a busy neighbour is then judged idle by its own minutes, not by its neighbour's.
Only when the GPU's listing can be trusted to be complete: every process on it belongs to a job of this agent, and
the processes' memory accounts for the GPU's memory used (within LISTING_SLACK_MIB, what the driver holds for
itself). An agent that cannot see the processes (run in a container without the host's PID namespace) or a GPU
used from outside the portal says nothing of the jobs it did not see, and they keep their GPU's figures.

With a complete listing the agent also says what the processes of no job use together (`GpuSample.others`: MiB,
and SM % where read): on a GPU split in shares, the work of whoever holds a share by a reservation and uses it
from a shell or a notebook, not through a portal job (apps/efficiency/selectors.py judges such a reservation by
it). The same figures per owner (`GpuSample.others_by_uid`: the real uid of each
process, `/proc/<pid>/status`) let the portal tell two reservations on one GPU apart: it knows which portal user
runs as which uid (apps.identity.models.UnixAccount). A process whose owner cannot be read (it just ended) counts
in the total only.

The same attribution gives each job its SM activity (`GpuSample.job_util`): its processes' per-process
utilization added up (capped at 100), or its MIG instance's GPM reading. On a GPU split in shares this, not the
GPU's utilization, says whether a holder computes or only holds memory. Not on a node whose shares run under MPS
(`process_activity=False`): there the clients' kernels run in the MPS server's context, so NVML may count their
work to the server's process and a busy job would read 0% and be reclaimed as idle; such a job is judged by its
GPU's utilization, as a reservation of a share is.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from workers.gpu.base import GpuSample
from workers.runtimes.process import proc_stat

logger = logging.getLogger(__name__)

PROC = Path("/proc")
# Memory used on a GPU that no listed process accounts for and the listing still counts as complete: the driver's
# own reservation (a few hundred MiB on recent boards); a model held by an unseen process takes far more.
LISTING_SLACK_MIB = 1024
_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """What the agent knows of one of its running jobs: the devices it was given and the runtime's handle."""

    job_id: int
    devices: tuple[str, ...]  # GPU uuids, or the MIG instance uuid
    handle: str  # "pid:<leader>" (process runtime) or the container id (docker)


def session_of(pid: int, proc: Path = PROC) -> int | None:
    """The session id of a process (field 6 of /proc/<pid>/stat), or None when it is gone or unreadable."""
    fields = proc_stat(pid, proc)
    try:
        return None if fields is None else int(fields[3])
    except (IndexError, ValueError):
        return None


def uid_of(pid: int, proc: Path = PROC) -> int | None:
    """The real uid of a process (the first field of the `Uid:` line of /proc/<pid>/status), or None when it is
    gone or unreadable. The real uid, not the effective one: a setuid helper still works for who started it."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def container_of(pid: int, proc: Path = PROC) -> str | None:
    """The 64-hex container id in a process's cgroup paths (Docker's `/docker/<id>` or `docker-<id>.scope`)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _CONTAINER_ID.search(text)
    return match.group(1) if match else None


class JobMemory:
    """Fills `GpuSample.job_memory` from the processes and MIG readings of a tick (see the module docstring).

    `jobs` lists the agent's running jobs (called once per tick that has something to attribute); `job_of_pid`,
    when given, names the job of a pid first (the simulated backend's); `uid_of_pid`, when given, names the owner
    of a pid instead of /proc (the simulated backend's, whose pids are no host process's)."""

    def __init__(
        self,
        jobs: Callable[[], list[RunningJob]],
        *,
        job_of_pid: Callable[[int], int | None] | None = None,
        uid_of_pid: Callable[[int], int | None] | None = None,
        proc: Path = PROC,
        process_activity: bool = True,
    ) -> None:
        self._jobs = jobs
        self._job_of_pid = job_of_pid
        self._uid_of_pid = uid_of_pid
        self._proc = proc
        self._process_activity = process_activity

    def annotate(self, samples: list[GpuSample]) -> list[GpuSample]:
        """The samples, each with the memory of the jobs found on it (unchanged when nothing was read)."""
        if not any(s.processes is not None or s.mig_memory for s in samples):
            return samples
        running = self._jobs()
        by_session: dict[int, int] = {}
        by_container: dict[str, int] = {}
        on_device: dict[str, int] = {}
        for job in running:
            if job.handle.startswith("pid:") and job.handle[4:].isdigit():
                by_session[int(job.handle[4:])] = job.job_id
            elif job.handle:
                by_container[job.handle] = job.job_id
            for device in job.devices:
                on_device[device] = job.job_id
        owners: dict[int, int | None] = {}

        def owner(pid: int) -> int | None:
            # Once per pid and tick: each lookup may read /proc, and a pid is asked for its memory, its SM
            # activity and whether it is anyone's.
            if pid not in owners:
                owners[pid] = self._job_of(pid, by_session, by_container)
            return owners[pid]

        out: list[GpuSample] = []
        for sample in samples:
            found = self._attribute(sample, owner, on_device)
            if found is None:
                out.append(sample)
                continue
            busy = self._busy(sample, owner, on_device)
            others = self._others(sample, owner)
            if others is not None and others[2] == 0:
                # Every process on the GPU is a job's: a running job with none there holds nothing there.
                for job in running:
                    if sample.uuid in job.devices and job.job_id not in found:
                        found[job.job_id] = 0
                        if sample.process_util is not None and self._process_activity:
                            busy[job.job_id] = 0
            theirs = None if others is None else (others[0], others[1])
            by_uid = None if others is None else self._by_owner(sample, owner)
            out.append(
                dataclasses.replace(
                    sample, job_memory=found, job_util=busy or None, others=theirs, others_by_uid=by_uid
                )
            )
        return out

    def _busy(
        self, sample: GpuSample, owner: Callable[[int], int | None], on_device: Mapping[str, int]
    ) -> dict[int, int]:
        """% of SMs busy per job: its processes' figures added up, or its MIG instance's."""
        busy: dict[int, int] = {}
        per_process = (sample.process_util or {}) if self._process_activity else {}
        for pid, pct in per_process.items():
            job_id = owner(pid)
            if job_id is not None:
                busy[job_id] = min(100, busy.get(job_id, 0) + pct)
        for uuid, pct in (sample.mig_util or {}).items():
            job_id = on_device.get(uuid)
            if job_id is not None:
                busy[job_id] = pct
        return busy

    def _others(self, sample: GpuSample, owner: Callable[[int], int | None]) -> tuple[int, int | None, int] | None:
        """What the processes of no job of this agent use on the GPU (MiB, SM % or None where not read, how many),
        or None where the listing may not show everything on it (see the module docstring)."""
        if sample.processes is None or sample.memory_used_mib is None or sample.mig_memory:
            return None
        if sample.memory_used_mib - sum(mib for _, mib in sample.processes) > LISTING_SLACK_MIB:
            return None
        theirs = [(pid, mib) for pid, mib in sample.processes if owner(pid) is None]
        busy: int | None = None
        if sample.process_util is not None and self._process_activity:
            busy = min(100, sum(sample.process_util.get(pid, 0) for pid, _ in theirs))
        elif not sample.processes and self._process_activity:
            busy = 0  # nothing on the GPU at all
        return sum(mib for _, mib in theirs), busy, len(theirs)

    def _by_owner(self, sample: GpuSample, owner: Callable[[int], int | None]) -> dict[int, tuple[int, int | None]]:
        """What the processes of no job use on the GPU per owner uid: {uid: (MiB, SM % or None where not read)}.
        Called only where `_others` found the listing complete."""
        per_process = sample.process_util if self._process_activity else None
        out: dict[int, tuple[int, int | None]] = {}
        for pid, mib in sample.processes or ():
            if owner(pid) is not None:
                continue
            uid = self._uid_of_pid(pid) if self._uid_of_pid is not None else uid_of(pid, self._proc)
            if uid is None:
                continue
            held, busy = out.get(uid, (0, None if per_process is None else 0))
            if per_process is not None:
                busy = min(100, (busy or 0) + per_process.get(pid, 0))
            out[uid] = (held + mib, busy)
        return out

    def _attribute(
        self, sample: GpuSample, owner: Callable[[int], int | None], on_device: Mapping[str, int]
    ) -> dict[int, int] | None:
        if sample.processes is None and not sample.mig_memory:
            return None
        found: dict[int, int] = {}
        for pid, mib in sample.processes or ():
            job_id = owner(pid)
            if job_id is not None:
                found[job_id] = found.get(job_id, 0) + mib
        for uuid, mib in (sample.mig_memory or {}).items():
            job_id = on_device.get(uuid)
            if job_id is not None:
                # The instance's own reading counts the job's CUDA context too; it wins over the process sum.
                found[job_id] = mib
        if sample.processes is None and not found:
            return None
        return found

    def _job_of(self, pid: int, by_session: Mapping[int, int], by_container: Mapping[str, int]) -> int | None:
        if self._job_of_pid is not None:
            job_id = self._job_of_pid(pid)
            if job_id is not None:
                return job_id
        if by_session:
            session = session_of(pid, self._proc)
            if session is not None and session in by_session:
                return by_session[session]
        if by_container:
            container = container_of(pid, self._proc)
            if container is not None:
                return by_container.get(container)
        return None
