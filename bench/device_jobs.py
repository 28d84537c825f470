"""The job path on a machine with real NVIDIA GPUs: what the node agent does with a job that asks for GPUs.

    .venv/bin/python -m bench.device_jobs [--seconds 6] [--json-out FILE]

Run by `bench/device_check.py` after the NVML and probe checks (or alone). With the GPUs NVML reports:

1. process runtime, one GPU: a torch job launched exactly as the agent launches it (`LaunchSpec` with the GPU's
   uuid, argv list, the runtime's clean environment). The job prints what CUDA shows it (device count, the
   device's uuid) and runs bf16 matrix products for `--seconds`; meanwhile NVML is sampled twice a second with
   processes read every tick, to see the job's pid on that GPU, its utilization and GPM tensor activity.
   Checks: exit 0, reason `exit_code`, exactly one visible device and it is the uuid the portal chose, the pid
   seen on that GPU, utilization and tensor activity above 0, the pid gone from the GPU after the exit.
2. process runtime, no GPU: the same program with no uuids sees no CUDA device (the empty
   `CUDA_VISIBLE_DEVICES` the runtime always sets).
3. process runtime, cancel and timeout while the GPU is busy: SIGTERM → reason `cancelled`; `max_duration_s`
   → reason `timeout`; afterwards the job's pid is gone from the GPU (memory freed).
4. docker runtime: if the `docker` SDK imports and an engine answers, a GPU container through
   `device_requests` (needs the NVIDIA Container Toolkit and a local image with torch, `--docker-image`);
   otherwise the create arguments a GPU job would get are printed, and why it could not run.

Exit status 0 when every check that could run passed, 1 when one failed, 2 when NVML is not usable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.gpu.base import GpuSample
from workers.gpu.nvml import NvmlBackend, NvmlUnavailable
from workers.runtimes.base import JobOutcome, LaunchSpec, RuntimeEvents
from workers.runtimes.process import ProcessRuntime

# The job's program: what CUDA shows it, then matrix products for SECONDS, one progress line a second.
JOB_PROGRAM = r"""
import os, sys, time
import torch
seconds = float(sys.argv[1])
print("visible", repr(os.environ.get("CUDA_VISIBLE_DEVICES")), "count", torch.cuda.device_count(), flush=True)
if torch.cuda.device_count() == 0:
    sys.exit(0)
props = torch.cuda.get_device_properties(0)
print("device", props.name, "uuid", str(props.uuid), "pid", os.getpid(), flush=True)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + seconds
n, last = 0, time.monotonic()
while time.monotonic() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
    n += 20
    if time.monotonic() - last >= 1.0:
        last = time.monotonic()
        print("products", n, flush=True)
print("done", n, "products", flush=True)
"""


class Collected:
    """RuntimeEvents that keep everything, for one runtime instance."""

    def __init__(self) -> None:
        self.started: dict[int, str] = {}
        self.logs: dict[int, list[str]] = {}
        self.outcomes: dict[int, JobOutcome] = {}
        self.done: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def events(self) -> RuntimeEvents:
        return RuntimeEvents(on_started=self.on_started, on_log=self.on_log, on_exit=self.on_exit)

    def expect(self, job_id: int) -> None:
        self.done[job_id] = threading.Event()

    def on_started(self, job_id: int, handle: str) -> None:
        self.started[job_id] = handle

    def on_log(self, job_id: int, stream: str, line: str) -> None:
        with self.lock:
            self.logs.setdefault(job_id, []).append(f"{stream}: {line}")

    def on_exit(self, outcome: JobOutcome) -> None:
        self.outcomes[outcome.job_id] = outcome
        self.done[outcome.job_id].set()


class GpuWatch:
    """Samples NVML every `every_s` with processes read each tick, in a thread, while a job runs."""

    def __init__(self, every_s: float = 0.5, *, keep_samples: bool = False) -> None:
        self.backend = NvmlBackend(slow_every_s=0.0)
        self.infos = self.backend.discover()
        self.every_s = every_s
        self.keep_samples = keep_samples
        self.samples: list[GpuSample] = []  # every sample as read, when keep_samples (bench/device_sharing.py)
        # Applied to each tick's samples as they are read (the agent's job attribution needs the jobs' live pids).
        self.annotate: Callable[[list[GpuSample]], list[GpuSample]] | None = None
        self.ticks: list[list[dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.ticks = []
        self.samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            samples = self.backend.sample(time.time())
            if self.annotate is not None:
                samples = self.annotate(samples)
            if self.keep_samples:
                self.samples.extend(samples)
            self.ticks.append(
                [
                    {
                        "uuid": s.uuid,
                        "util": s.utilization_pct,
                        "mem": s.memory_used_mib,
                        "tensor": s.tensor_active,
                        "procs": s.processes,
                        "proc_util": s.process_util,
                    }
                    for s in samples
                ]
            )
            self._stop.wait(self.every_s)

    def pids_on(self, uuid: str) -> set[int]:
        return {pid for tick in self.ticks for g in tick if g["uuid"] == uuid for pid, _mib in g["procs"] or []}

    def max_util(self, uuid: str) -> int:
        return max((g["util"] or 0 for tick in self.ticks for g in tick if g["uuid"] == uuid), default=0)

    def max_tensor(self, uuid: str) -> float | None:
        values = [g["tensor"] for tick in self.ticks for g in tick if g["uuid"] == uuid and g["tensor"] is not None]
        return max(values) if values else None

    def max_mem(self, uuid: str) -> int:
        return max((g["mem"] or 0 for tick in self.ticks for g in tick if g["uuid"] == uuid), default=0)

    def snapshot(self, uuid: str) -> dict[str, Any]:
        """One extra read now (processes included): what the GPU holds at this moment."""
        for s in self.backend.sample(time.time()):
            if s.uuid == uuid:
                return {"util": s.utilization_pct, "mem": s.memory_used_mib, "procs": s.processes}
        return {}

    def close(self) -> None:
        self.backend.close()


def _job_pid(logs: list[str]) -> int | None:
    for line in logs:
        parts = line.split()
        if "pid" in parts:
            return int(parts[parts.index("pid") + 1])
    return None


def _uuid_matches(logs: list[str], uuid: str) -> bool:
    want = uuid.removeprefix("GPU-").removeprefix("MIG-")
    return any(line.split("uuid", 1)[-1].strip().split()[0] == want for line in logs if " uuid " in line)


def check_process_runtime(watch: GpuWatch, seconds: float) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    uuid = watch.infos[0].uuid
    collected = Collected()
    state_dir = tempfile.mkdtemp(prefix="portal-device-jobs-")
    runtime = ProcessRuntime(state_dir=state_dir, events=collected.events(), timeout_grace_s=3.0)
    python = sys.executable

    def run(
        job_id: int,
        name: str,
        gpu_uuids: list[str],
        *,
        job_seconds: float,
        max_duration_s: int = 0,
        cancel_after_s: float | None = None,
    ) -> dict[str, Any]:
        collected.expect(job_id)
        spec = LaunchSpec(
            job_id=job_id,
            image="(process runtime)",
            command=[python, "-c", JOB_PROGRAM, str(job_seconds)],
            gpu_uuids=gpu_uuids,
            max_duration_s=max_duration_s,
        )
        watch.start()
        began = time.monotonic()
        runtime.launch(spec)
        if cancel_after_s is not None:
            time.sleep(cancel_after_s)
            runtime.stop(job_id, grace_s=3.0)
        finished = collected.done[job_id].wait(job_seconds + 60)
        took = time.monotonic() - began
        watch.stop()
        logs = collected.logs.get(job_id, [])
        outcome = collected.outcomes.get(job_id)
        pid = _job_pid(logs)
        time.sleep(0.5)  # the driver frees the context's memory a moment after the process is gone
        after = watch.snapshot(uuid)
        result: dict[str, Any] = {
            "check": name,
            "finished": finished,
            "seconds": round(took, 2),
            "state": outcome and outcome.state,
            "reason": outcome and outcome.reason,
            "exit_code": outcome and outcome.exit_code,
            "message": outcome and outcome.message,
            "job_pid": pid,
            "pids_seen_on_gpu": sorted(watch.pids_on(uuid)),
            "max_util_pct": watch.max_util(uuid),
            "max_mem_mib": watch.max_mem(uuid),
            "max_tensor_active": watch.max_tensor(uuid),
            "after": after,
            "logs": logs[:4] + (["…"] if len(logs) > 6 else []) + logs[4:][-2:],
        }
        print(f"\n[{name}] {result['state']}/{result['reason']} exit {result['exit_code']} in {took:.1f} s")
        for line in result["logs"]:
            print(f"    {line}")
        print(
            f"    NVML while running: pids {result['pids_seen_on_gpu']}, max util {result['max_util_pct']}%, "
            f"max tensor activity {result['max_tensor_active']}, "
            f"max memory {result['max_mem_mib']} MiB; after exit: {after}"
        )
        return result

    try:
        r = run(1, "gpu job, one GPU", [uuid], job_seconds=seconds)
        r["ok"] = (
            r["finished"]
            and r["reason"] == "exit_code"
            and r["exit_code"] == 0
            and any("count 1" in line for line in r["logs"])
            and _uuid_matches(r["logs"], uuid)
            and r["job_pid"] in r["pids_seen_on_gpu"]
            and r["max_util_pct"] > 0
            # GPM's tensor activity (Hopper): bf16 products must show; None where the GPU has no GPM.
            and (r["max_tensor_active"] is None or r["max_tensor_active"] > 0)
            and r["job_pid"] not in {p for p, _ in r["after"].get("procs") or []}
        )
        results.append(r)

        r = run(2, "no GPU asked, none visible", [], job_seconds=1)
        r["ok"] = r["finished"] and r["exit_code"] == 0 and any("count 0" in line for line in r["logs"])
        results.append(r)

        r = run(3, "cancel while the GPU is busy", [uuid], job_seconds=60, cancel_after_s=min(seconds, 8.0))
        r["ok"] = (
            r["finished"]
            and r["reason"] == "cancelled"
            and r["job_pid"] in r["pids_seen_on_gpu"]
            and r["job_pid"] not in {p for p, _ in r["after"].get("procs") or []}
        )
        results.append(r)

        r = run(4, "max_duration_s while the GPU is busy", [uuid], job_seconds=60, max_duration_s=8)
        r["ok"] = (
            r["finished"]
            and r["reason"] == "timeout"
            and r["job_pid"] in r["pids_seen_on_gpu"]
            and r["job_pid"] not in {p for p, _ in r["after"].get("procs") or []}
        )
        results.append(r)
    finally:
        runtime.close()
        shutil.rmtree(state_dir, ignore_errors=True)
    return results


def check_docker_runtime(watch: GpuWatch, image: str | None, seconds: float) -> dict[str, Any]:
    uuid = watch.infos[0].uuid
    tools = {name: shutil.which(name) for name in ("docker", "dockerd", "nvidia-container-runtime", "nvidia-ctk")}
    print(f"\n[docker runtime] tools on this machine: {tools}")
    result: dict[str, Any] = {"check": "docker runtime", "tools": tools}
    try:
        from workers.runtimes.docker import DockerRuntime
    except ImportError as exc:
        result.update(ran=False, why=f"docker SDK not importable: {exc}")
        print(f"    not run: {result['why']}")
        return result
    import docker

    collected = Collected()
    gpu_spec = LaunchSpec(
        job_id=5,
        image=image or "(an image with torch)",
        command=["python3", "-c", JOB_PROGRAM, str(seconds)],
        gpu_uuids=[uuid],
        memory_mib=16384,
        cpus=4,
        max_duration_s=600,
        use_nvidia_runtime=True,
    )
    try:
        runtime = DockerRuntime(events=collected.events(), api_timeout_s=10)
        version = runtime.client.version()
    except Exception as exc:  # no engine, for any reason: show what it would have been sent
        result.update(ran=False, why=f"no Docker engine answers: {exc}")
        print(f"    not run: {result['why']}")
        # A client with a fixed API version does not contact the engine until used, so this is a pure dry run.
        offline = DockerRuntime(client=docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41"))
        kwargs = offline.create_kwargs(gpu_spec)
        kwargs["command"] = [*kwargs["command"][:2], "<program>", *kwargs["command"][3:]]
        result["create_kwargs"] = json.loads(json.dumps(kwargs, default=_jsonable))
        print("    what a GPU job's container would be created with:")
        print("    " + json.dumps(result["create_kwargs"], indent=2, default=str).replace("\n", "\n    "))
        return result
    result["engine"] = version.get("Version")
    if not image:
        result.update(ran=False, why="engine answers but no --docker-image with torch was given")
        print(f"    not run: {result['why']}")
        runtime.close()
        return result
    collected.expect(5)
    watch.start()
    runtime.launch(gpu_spec)
    finished = collected.done[5].wait(seconds + 120)
    watch.stop()
    runtime.close()
    outcome = collected.outcomes.get(5)
    logs = collected.logs.get(5, [])
    result.update(
        ran=True,
        finished=finished,
        reason=outcome and outcome.reason,
        exit_code=outcome and outcome.exit_code,
        message=outcome and outcome.message,
        logs=logs[:4],
        max_util_pct=watch.max_util(uuid),
        ok=bool(finished and outcome and outcome.exit_code == 0 and _uuid_matches(logs, uuid)),
    )
    print(f"    {result}")
    return result


def _jsonable(value: Any) -> Any:
    # docker.types objects are dicts underneath; anything else is shown by its repr.
    return dict(value) if isinstance(value, dict) else repr(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--docker-image", default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    report = run_all(args.seconds, args.docker_image)
    out = args.json_out or (Path(os.environ["OUT"]) / "device_jobs.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.write_text(json.dumps(report, indent=2, default=str))
    if report.get("error"):
        return 2
    return 0 if report["ok"] else 1


def run_all(seconds: float, docker_image: str | None = None) -> dict[str, Any]:
    try:
        watch = GpuWatch()
    except NvmlUnavailable as exc:
        print(f"device jobs: NVML is not usable here: {exc}", file=sys.stderr)
        return {"error": str(exc), "ok": False}
    try:
        if not watch.infos:
            return {"error": "NVML reports no GPU", "ok": False}
        print(f"\nJobs on {watch.infos[0].uuid} ({watch.infos[0].name}), process runtime:")
        process = check_process_runtime(watch, seconds)
        docker_result = check_docker_runtime(watch, docker_image, seconds)
    finally:
        watch.close()
    ok = all(r["ok"] for r in process) and docker_result.get("ok", True) is not False
    print("\njob checks:", ", ".join(f"{r['check']}: {'ok' if r['ok'] else 'FAILED'}" for r in process))
    return {"process": process, "docker": docker_result, "ok": ok}


if __name__ == "__main__":
    sys.exit(main())
