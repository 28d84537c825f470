"""The node agent: one per GPU node. No Django import (a GPU node runs users' code and holds no database credentials).

    python -m workers.agent --name NODE [--backend auto|nvml|simulated] [--gpus 8 --models A100-80GB,H100-80GB]
        [--seed N] [--broker URL] [--token TOKEN] [--heartbeat 5] [--probe-on-start] [--state-dir DIR]

The token comes from `--token` or GPUPORTAL_NODE_TOKEN (`manage.py create_node_token NODE` prints one); the broker
from `--broker`, GPUPORTAL_BROKER_URL or REDIS_URL (unix:// or redis:// URLs; the portal's broker).

What it does, in one process:
- discovers the GPUs (NVML when it initialises and finds GPUs, else simulated ones; `--backend` forces a choice),
- registers them with the portal (`fleet.register`; again every `--register-every` seconds: it is idempotent, and
  at once when the GPUs' MIG layout, read again every `--layout-check-every` seconds, has changed),
- heartbeats every `--heartbeat` seconds (`fleet.heartbeat`),
- samples telemetry at 1 Hz through workers.sampler, appended to the Redis stream `fleet:ingest` (or, with
  `--telemetry-via celery`, sent as `telemetry.ingest` tasks expiring after 10 s),
- runs a Celery worker on its own queue `node.<name>` for the portal's commands: `agent.hold_gpus`,
  `agent.run_probe` (workers/agent_app.py) and the job commands registered by workers/agent_jobs.py.
Messages to the portal leave through one sender thread (workers/transport.py). SIGTERM or Ctrl-C: Celery's warm
shutdown, then the sampler and heartbeat stop and what is queued is flushed for up to 3 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from workers.agent_app import install_tasks
from workers.agent_host import DEFAULT_MODELS, AgentConfig
from workers.agent_jobs import JobRunner
from workers.agent_state import HoldStore
from workers.gpu.base import GpuBackend, GpuInfo, LayoutRefresh
from workers.logredact import mask_handlers
from workers.sampler import Sampler
from workers.transport import AGENT_VERSION, PortalLink, make_celery, make_stream_client, node_queue

__all__ = ["Agent", "AgentConfig", "choose_backend", "main", "parse_args"]

logger = logging.getLogger("workers.agent")

PROBE_TIMEOUT_S = 600.0


def choose_backend(cfg: AgentConfig) -> tuple[GpuBackend, str]:
    """(backend, "nvml" | "simulated"). auto: NVML if it initialises and finds a GPU, else simulated."""
    if cfg.backend in ("auto", "nvml"):
        from workers.gpu.nvml import NvmlBackend, NvmlUnavailable

        try:
            nvml = NvmlBackend()
            if nvml.discover():
                return nvml, "nvml"
            nvml.close()
            reason = "NVML found no GPU"
        except NvmlUnavailable as exc:
            reason = str(exc)
        if cfg.backend == "nvml":
            raise SystemExit(f"--backend nvml: {reason}")
        logger.info("using simulated GPUs: %s", reason)
    from workers.gpu.simulated import SimulatedBackend, job_profiles

    models = list(itertools.islice(itertools.cycle(cfg.models), cfg.gpus))
    sim = SimulatedBackend(cfg.name, models, seed=cfg.seed)
    profiles = job_profiles()
    found = sim.discover()
    wanted = cfg.simulate_busy_gpus
    busy = [g for g in found if g.index in wanted] if wanted else found[: cfg.simulate_busy]
    owners = dict(cfg.simulate_busy_uids)
    for i, info in enumerate(busy):
        sim.assign(info.uuid, f"{cfg.name}-demo-{i}", profiles[i % len(profiles)], uid=owners.get(info.index))
    return sim, "simulated"


class Agent:
    """The agent's parts and their threads; `run()` blocks in the Celery worker until shutdown."""

    def __init__(self, cfg: AgentConfig, backend: GpuBackend | None = None, backend_kind: str | None = None) -> None:
        self.cfg = cfg
        if backend is None:
            backend, backend_kind = choose_backend(cfg)
        self.backend = backend
        self.backend_kind = backend_kind or "simulated"
        self.gpus: list[GpuInfo] = backend.discover()
        self.gpu_by_uuid = {g.uuid: g for g in self.gpus}
        self.app = make_celery(cfg.broker, cfg.name)
        # A redis-py client on the broker: the telemetry stream, and the link's check for a restarted Redis.
        redis_client = make_stream_client(cfg.broker) if cfg.broker.startswith(("redis", "unix")) else None
        stream = redis_client if cfg.telemetry_via == "stream" else None
        self.link = PortalLink(self.app, node=cfg.name, token=cfg.token, stream=stream, broker=redis_client)
        state_file = cfg.state_dir / "holds.json" if cfg.state_dir else None
        self.holds = HoldStore(state_file)
        self.sampler = Sampler(backend, self.link.telemetry, node=cfg.name, period_s=cfg.sample_period_s)
        self.stop_event = threading.Event()
        self.probe_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.job_runner: JobRunner = install_tasks(self.app, self)

    # -- messages to the portal ----------------------------------------------------------------------------

    def registration(self) -> dict[str, Any]:
        driver = next((str(g.extra.get("driver_version")) for g in self.gpus if g.extra.get("driver_version")), "")
        return {
            "gpus": [
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "model": g.model,
                    "name": g.name,
                    "memory_mib": g.memory_mib,
                    "mig_mode": g.mig_mode,
                    "mig_devices": [d.to_dict() for d in g.mig_devices],
                }
                for g in self.gpus
            ],
            "agent_version": AGENT_VERSION,
            "driver_version": driver[:64],
            "hostname": socket.gethostname()[:255],
            "backend": self.backend_kind,
        }

    def register(self) -> None:
        self.link.send("fleet.register", self.registration())

    def heartbeat(self) -> None:
        body = {"agent_version": AGENT_VERSION, "holds": len(self.holds.active())}
        self.link.send("fleet.heartbeat", body, expires=self.cfg.heartbeat_s * 3, critical=False)

    def check_layout(self) -> bool:
        """Read the GPUs' MIG layout again; when an admin changed it (mig-parted) under the running agent, take
        the new one and register it at once, so the portal moves the bookings it strands without waiting for
        the next periodic registration. Whether it changed."""
        if not isinstance(self.backend, LayoutRefresh):
            return False
        try:
            changed = self.backend.refresh_layout()
        except Exception:  # a driver hiccup must not stop the heartbeat
            logger.exception("reading the MIG layout failed")
            return False
        if changed:
            self.gpus = self.backend.discover()
            self.gpu_by_uuid = {g.uuid: g for g in self.gpus}
            logger.info("MIG layout changed: registering again")
            self.register()
        return changed

    def _heartbeat_loop(self) -> None:
        since_register = 0.0
        since_layout = 0.0
        while not self.stop_event.wait(self.cfg.heartbeat_s):
            self.heartbeat()
            since_register += self.cfg.heartbeat_s
            since_layout += self.cfg.heartbeat_s
            if since_layout >= self.cfg.layout_check_s:
                since_layout = 0.0
                if self.check_layout():
                    since_register = 0.0
            if since_register >= self.cfg.register_every_s:
                since_register = 0.0
                self.register()

    # -- probe ---------------------------------------------------------------------------------------------------

    def run_probe(self, gpu_uuid: str) -> dict[str, Any]:
        """Run workers.probes.torch_probe on one GPU in a child process (torch stays out of the agent's memory, and
        CUDA_VISIBLE_DEVICES pins the probe to that GPU by uuid) and report the result as `fleet.probe_result`."""
        if gpu_uuid not in self.gpu_by_uuid:
            raise ValueError(f"no GPU {gpu_uuid} on this node")
        env = dict(os.environ)
        if self.backend_kind == "nvml":
            device = "cuda:0"
            env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
        else:
            device = "cpu"  # simulated GPUs: exercise the probe's code path on the CPU; the verdict is "n/a"
        argv = [sys.executable, "-m", "workers.probes.torch_probe", "--device", device, "--json"]
        report: dict[str, Any] = {"gpu_uuid": gpu_uuid}
        with self.probe_lock:  # one probe at a time: two would measure each other
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                report["error"] = f"probe timed out after {PROBE_TIMEOUT_S:.0f} s"
            else:
                if proc.returncode in (0, 3):
                    try:
                        result = json.loads(proc.stdout)
                        if self.backend_kind != "nvml":
                            result.setdefault("notes", []).append("simulated GPU: probe ran on the agent's CPU")
                        report["result"] = result
                    except ValueError:
                        report["error"] = "probe printed no JSON"
                else:
                    report["error"] = (proc.stderr.strip() or f"probe exited with {proc.returncode}")[-2000:]
        self.link.send("fleet.probe_result", report)
        logger.info("probe of %s: %s", gpu_uuid, report.get("result", {}).get("comparison") or report.get("error"))
        return report

    def _probe_all(self) -> None:
        for gpu in self.gpus:
            if self.stop_event.is_set():
                return
            try:
                self.run_probe(gpu.uuid)
            except Exception:
                logger.exception("probe of %s failed", gpu.uuid)

    # -- life cycle ----------------------------------------------------------------------------------------------

    def start_background(self) -> None:
        """Everything but the Celery worker: sender, registration, heartbeat, sampler (and the start-up probe)."""
        self.link.start()
        self.register()
        self.heartbeat()
        hb = threading.Thread(target=self._heartbeat_loop, name="agent-heartbeat", daemon=True)
        hb.start()
        self._threads.append(hb)
        self.sampler.start()
        if self.cfg.probe_on_start:
            probe = threading.Thread(target=self._probe_all, name="agent-probe", daemon=True)
            probe.start()
            self._threads.append(probe)

    def stop_background(self) -> None:
        self.stop_event.set()
        self.sampler.stop()
        self.link.stop()
        try:
            self.backend.close()
        except Exception:
            logger.exception("closing the GPU backend failed")

    def run(self, loglevel: str = "INFO") -> int:
        logger.info(
            "agent %s: %d %s GPU(s) [%s], queue %s",
            self.cfg.name,
            len(self.gpus),
            self.backend_kind,
            ", ".join(sorted({g.model for g in self.gpus})),
            node_queue(self.cfg.name),
        )
        self.start_background()
        if self.cfg.telemetry_only:
            return self._run_telemetry_only()
        try:
            argv = [
                *(["--quiet"] if self.cfg.quiet else []),
                "worker",
                "-Q",
                node_queue(self.cfg.name),
                "-P",
                "threads",
                "-c",
                str(self.cfg.concurrency),
                "-n",
                f"agent-{self.cfg.name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                loglevel,
            ]
            code = self.app.worker_main(argv)
        finally:
            self.stop_background()
        return int(code or 0)

    def _run_telemetry_only(self) -> int:
        """No Celery worker (so no job runner and no inventory): the background threads until SIGTERM/SIGINT."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop_event.set())
        try:
            self.stop_event.wait()
        finally:
            self.stop_background()
        return 0


def parse_args(argv: list[str] | None = None) -> tuple[AgentConfig, str]:
    p = argparse.ArgumentParser(prog="python -m workers.agent", description="GPU Portal node agent.")
    p.add_argument("--name", required=True, help="node name, as created with manage.py create_node_token")
    p.add_argument("--backend", choices=["auto", "nvml", "simulated"], default="auto")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs (ignored with NVML)")
    p.add_argument("--models", default=DEFAULT_MODELS, help="simulated models, comma-separated, cycled over --gpus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--broker", default=os.environ.get("GPUPORTAL_BROKER_URL") or os.environ.get("REDIS_URL"))
    p.add_argument("--token", default=os.environ.get("GPUPORTAL_NODE_TOKEN"), help="or GPUPORTAL_NODE_TOKEN")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    p.add_argument("--register-every", type=float, default=300.0)
    p.add_argument("--layout-check-every", type=float, default=30.0, help="seconds between reads of the MIG layout")
    p.add_argument("--probe-on-start", action="store_true", help="probe every GPU after registering")
    p.add_argument("--simulate-busy", type=int, default=0, help="simulated GPUs given a trace workload at start")
    p.add_argument(
        "--simulate-busy-gpus",
        default="",
        help="indexes of the simulated GPUs given a trace workload, each with :uid to run it as that uid (0:1002,1,6)",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="where holds are kept (default: memory only)")
    p.add_argument("--concurrency", type=int, default=4, help="threads serving the node queue")
    p.add_argument(
        "--telemetry-via",
        choices=["stream", "celery"],
        default="stream",
        help="stream: Redis stream fleet:ingest, read in batches by manage.py ingest_telemetry (default); "
        "celery: one telemetry.ingest task per second on queue control",
    )
    p.add_argument(
        "--runtime",
        choices=["auto", "docker", "process"],
        default=os.environ.get("GPUPORTAL_RUNTIME", "auto"),
        help="how jobs run: docker (the NVIDIA Container Toolkit on GPU nodes), process, or auto (docker if an "
        "engine answers); also GPUPORTAL_RUNTIME",
    )
    p.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="cancel this node's jobs when the agent stops (the all-in-one `make run`); by default they keep "
        "running and the agent adopts them when it starts again",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no Celery banner at start (the all-in-one `make run` prints its own)",
    )
    p.add_argument(
        "--telemetry-only",
        action="store_true",
        help="a node another scheduler runs (a Slurm pool): register, heartbeat and sample GPUs, run no jobs",
    )
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    a = p.parse_args(argv)
    if not a.token:
        p.error("a node token is required: --token or GPUPORTAL_NODE_TOKEN (manage.py create_node_token NODE)")
    if not a.broker:
        p.error("a broker is required: --broker, GPUPORTAL_BROKER_URL or REDIS_URL")
    if not 1 <= a.gpus <= 64:
        p.error("--gpus must be 1-64")
    if a.heartbeat <= 0:
        p.error("--heartbeat must be positive")
    try:
        busy = [item.strip().partition(":") for item in a.simulate_busy_gpus.split(",") if item.strip()]
        busy_gpus = tuple(int(i) for i, _, _ in busy)
        busy_uids = tuple((int(i), int(uid)) for i, _, uid in busy if uid)
    except ValueError:
        p.error("--simulate-busy-gpus: GPU indexes, comma-separated, each with :uid where its load runs as a uid")
    if any(uid <= 0 for _, uid in busy_uids):
        p.error("--simulate-busy-gpus: a uid is a positive number (never root)")
    if any(not 0 <= i < a.gpus for i in busy_gpus):
        p.error("--simulate-busy-gpus: an index outside the simulated GPUs")
    models = tuple(m.strip() for m in a.models.split(",") if m.strip())
    from workers.gpu.specs import SPECS

    unknown = [m for m in models if m.partition(":")[0] not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(SPECS))}")
    cfg = AgentConfig(
        name=a.name,
        token=a.token,
        broker=a.broker,
        backend=a.backend,
        gpus=a.gpus,
        models=models or (DEFAULT_MODELS,),
        seed=a.seed,
        heartbeat_s=a.heartbeat,
        register_every_s=a.register_every,
        layout_check_s=a.layout_check_every,
        probe_on_start=a.probe_on_start,
        state_dir=a.state_dir,
        simulate_busy=max(0, a.simulate_busy),
        simulate_busy_gpus=busy_gpus,
        simulate_busy_uids=busy_uids,
        concurrency=max(1, a.concurrency),
        telemetry_via=a.telemetry_via,
        runtime=a.runtime,
        stop_jobs_on_exit=a.stop_jobs_on_exit,
        telemetry_only=a.telemetry_only,
        quiet=a.quiet,
    )
    return cfg, a.log_level


def main(argv: list[str] | None = None) -> int:
    cfg, loglevel = parse_args(argv)
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The agent's Celery app keeps the root logger's handlers (worker_hijack_root_logger=False, transport.py), so
    # what its worker logs passes this filter too.
    mask_handlers()
    return Agent(cfg).run(loglevel)


if __name__ == "__main__":
    sys.exit(main())
