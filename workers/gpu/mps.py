"""The limits NVIDIA's MPS control daemon holds a job on a share of a GPU to.

Why the agent sets them rather than leaving it to the job's environment: a client's
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` can only lower what the daemon grants
it, so a job that unsets them would get whatever the daemon allows: all of the GPU unless the daemon was told
otherwise. Before a job on a share starts, the agent sets its device's pinned-memory limit to the share's memory and
the thread percentage to at least the share's, on the running MPS servers (``set_device_pinned_mem_limit``,
``set_active_thread_percentage``: clients created afterwards observe them) and as defaults for servers started later
(``set_default_*``). The memory limit is per device, not per job: the agent sets it to the most any job on a share
of that device holds now (jobs on one, two or three quarters of a GPU can run side by side), and each job's
environment lowers its own clients' to its share. The thread percentage is per server: it is raised to the largest
share this agent has started, and each job's environment lowers its own. So a job that keeps its environment gets
exactly its share; one that unsets it gets at most what the biggest job beside it holds, and never the whole GPU.

The daemon names devices by CUDA ordinal; start it with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so ordinals are NVML's
(and nvidia-smi's) indices, which the agent passes. Commands go to ``nvidia-cuda-mps-control`` on its standard
input, one invocation per command, as an argv list; ``CUDA_MPS_PIPE_DIRECTORY`` chooses the daemon.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence

DEFAULT_BINARY = "nvidia-cuda-mps-control"


class MpsError(RuntimeError):
    """The control daemon refused a command or could not be reached."""


class MpsControl:
    """Talks to one MPS control daemon (the one ``pipe_dir`` names, or the default ``/tmp/nvidia-mps``)."""

    def __init__(self, binary: str = DEFAULT_BINARY, *, pipe_dir: str | None = None, timeout_s: float = 10.0) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._thread_pct = 0
        self._memory: dict[int, int] = {}  # device -> the pinned-memory limit this process last set on it

    def command(self, line: str) -> str:
        """Send one command; returns what the daemon printed."""
        env = dict(os.environ)
        if self.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        try:
            done = subprocess.run(
                [self.binary],
                input=line + "\n",
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{self.binary}: {exc}") from exc
        out = done.stdout.strip()
        # The daemon answers a refused command with a line starting with "Error" (and exit status 0 on older drivers).
        if done.returncode != 0 or out.lower().startswith("error") or done.stderr.strip().lower().startswith("error"):
            said = (out or done.stderr.strip() or f"exit status {done.returncode}").splitlines()[0]
            raise MpsError(f"{self.binary} refused {line.split()[0]!r}: {said}")
        return out

    def servers(self) -> list[int]:
        """PIDs of the MPS servers running now."""
        return [int(word) for word in self.command("get_server_list").split() if word.isdigit()]

    def limit_share(self, device: int, memory_mib: int, thread_pct: int) -> list[str]:
        """Hold clients of ``device`` created from now on to ``memory_mib`` of pinned memory, and the server to at
        least ``thread_pct`` percent of the SMs; returns the commands sent. Serialised: two launches must not
        interleave their settings."""
        if device < 0 or memory_mib < 1 or not 1 <= thread_pct <= 100:
            raise MpsError(f"no MPS limit for device {device}, {memory_mib} MiB, {thread_pct}%")
        with self._lock:
            pct = max(self._thread_pct, thread_pct)
            lines = [
                f"set_default_device_pinned_mem_limit {device} {memory_mib}M",
                f"set_default_active_thread_percentage {pct}",
            ]
            for pid in self.servers():
                lines.append(f"set_device_pinned_mem_limit {pid} {device} {memory_mib}M")
                lines.append(f"set_active_thread_percentage {pid} {pct}")
            for line in lines:
                self.command(line)
            self._thread_pct = pct
            self._memory[device] = memory_mib
            return lines

    def memory_limit(self, device: int) -> int | None:
        """The pinned-memory limit (MiB) last set on ``device`` through this object, or None if none was."""
        return self._memory.get(device)


class ShareLimits:
    """What an agent tells its MPS daemon as jobs start and end (workers/agent_jobs.JobRunner).

    A job on a share: the device's memory limit becomes the most any job on a share of it holds now (the limit is per
    device, and a client's own variable can only lower it, so a half-GPU job beside a quarter must not have the
    processes it starts later held to the quarter's memory). A whole-GPU job on a device whose shares were limited
    before (a GPU split in shares, taken whole): the limit goes back to the GPU's memory first."""

    def __init__(self, control: MpsControl, gpu_index: Mapping[str, int], gpu_memory: Mapping[str, int]) -> None:
        self.control = control
        self.gpu_index = dict(gpu_index)  # GPU uuid -> CUDA ordinal (= NVML index with CUDA_DEVICE_ORDER=PCI_BUS_ID)
        self.gpu_memory = dict(gpu_memory)  # GPU uuid -> MiB
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, int]] = {}  # job on a share -> (device, its memory in MiB)

    def before_launch(self, job_id: int, gpu_uuids: Sequence[str], share: float, memory_mib: int) -> None:
        """Set (or lift) the limits for a job about to start; raises MpsError when the daemon refuses."""
        if share >= 1.0:
            for uuid in gpu_uuids:
                device = self.gpu_index.get(uuid)
                whole = self.gpu_memory.get(uuid, 0)
                limit = self.control.memory_limit(device) if device is not None else None
                if device is not None and limit is not None and limit < whole:
                    self.control.limit_share(device, whole, 100)
            return
        if len(gpu_uuids) != 1:
            return
        device = self.gpu_index.get(gpu_uuids[0])
        if device is None:
            raise MpsError(f"{gpu_uuids[0]} is not a GPU of this node the daemon knows")
        with self._lock:
            self._held[job_id] = (device, memory_mib)
            ceiling = max(memory for d, memory in self._held.values() if d == device)
        try:
            self.control.limit_share(device, ceiling, max(1, round(share * 100)))
        except MpsError:
            self.forget(job_id)
            raise

    def forget(self, job_id: int) -> None:
        """The job ended (or never started): its share no longer counts towards its device's limit."""
        with self._lock:
            self._held.pop(job_id, None)
