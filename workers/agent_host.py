"""What the agent's command modules (workers/agent_app.py, workers/agent_jobs.py) see of the agent.

They are handed the running agent; typing it as this protocol, not as `workers.agent.Agent`, keeps those modules
free of the agent's module, which imports them to install their tasks. No Django here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workers.agent_state import HoldStore
from workers.gpu.base import GpuBackend, GpuInfo
from workers.sampler import Sampler
from workers.transport import CommandRejected, PortalLink, verify_command

logger = logging.getLogger("workers.agent")

DEFAULT_MODELS = "A100-80GB"


@dataclass
class AgentConfig:
    name: str
    token: str
    broker: str
    backend: str = "auto"  # auto | nvml | simulated
    gpus: int = 8
    models: tuple[str, ...] = (DEFAULT_MODELS,)
    seed: int = 0
    heartbeat_s: float = 5.0
    register_every_s: float = 300.0
    layout_check_s: float = 30.0  # how often the GPUs' MIG layout is read again (an admin's mig-parted)
    sample_period_s: float = 1.0
    probe_on_start: bool = False
    state_dir: Path | None = None
    simulate_busy: int = 0  # simulated backend: GPUs given a trace workload at start (demos, benchmarks)
    simulate_busy_gpus: tuple[int, ...] = ()  # or these GPUs, by index, instead of the first `simulate_busy`
    # (index, uid) of those whose load runs as a uid: a person's own work started outside the portal
    simulate_busy_uids: tuple[tuple[int, int], ...] = ()
    concurrency: int = 4
    telemetry_via: str = "stream"  # stream (Redis stream fleet:ingest, batched by the portal) | celery
    runtime: str = ""  # auto | docker | process; empty = GPUPORTAL_RUNTIME or auto (workers/agent_jobs.py)
    stop_jobs_on_exit: bool = False  # cancel this node's jobs when the agent stops (make run's local agent)
    # Another scheduler (Slurm) runs this node's jobs: register, heartbeat and sample only; no job runtime, no
    # job inventory (it would report the scheduler's jobs as missing here).
    telemetry_only: bool = False
    quiet: bool = False  # no Celery banner at start


class AgentHost(Protocol):
    """The parts of a running agent its commands use."""

    cfg: AgentConfig
    backend: GpuBackend
    backend_kind: str
    gpu_by_uuid: dict[str, GpuInfo]
    holds: HoldStore
    link: PortalLink
    sampler: Sampler

    def run_probe(self, gpu_uuid: str) -> dict[str, Any]: ...


def command_body(agent: AgentHost, task: str, envelope: Any) -> dict[str, Any] | None:
    """The verified body of a command for this agent, or None (logged) when refused."""
    try:
        return verify_command(envelope, node=agent.cfg.name, token=agent.cfg.token, task=task)
    except CommandRejected as exc:
        logger.warning("%s refused: %s", task, exc)
        return None
