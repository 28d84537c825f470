"""One prepared check for a machine with real NVIDIA GPUs: the NVML backend and the torch probe, end to end.

    .venv/bin/python -m bench.device_check [--samples 5] [--json-out FILE] [--no-probe] [--size 8192]

1. NvmlBackend: discover the GPUs (and the MIG instances of a GPU in MIG mode) and print them.
2. The real Sampler over NVML at 1 Hz for `--samples` ticks: every message printed as a table, each tick's
   sample() wall time (the driver cost the agent pays each second; slow ticks read processes and ECC), with the
   memory each MIG instance uses (and its SM activity, where GPM gives it: Hopper and later).
3. The torch probe on every CUDA device: TFLOPS and bandwidth against the spec sheet.

Output: readable text, then everything as one JSON document (also written to --json-out, or to $OUT/device_check.json
when $OUT is set). Exit status: 0 all fine, 3 a probe says degraded, 2 NVML unusable (with the reason).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# NVML numbers GPUs in PCI bus order; CUDA by default puts the fastest first. Align them before torch loads.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

from workers.gpu.base import GpuSample, build_message, parse_message
from workers.gpu.nvml import NvmlBackend, NvmlUnavailable
from workers.sampler import Sampler


class TimedBackend:
    """Wraps the NVML backend to record how long each sample() takes (wall clock, driver included)."""

    def __init__(self, inner: NvmlBackend) -> None:
        self.inner = inner
        self.durations_ms: list[float] = []

    def discover(self) -> Any:
        return self.inner.discover()

    def sample(self, now: float) -> list[GpuSample]:
        began = time.perf_counter()
        try:
            return self.inner.sample(now)
        finally:
            self.durations_ms.append((time.perf_counter() - began) * 1000)

    def close(self) -> None:
        self.inner.close()


def fmt(value: Any, width: int) -> str:
    return f"{'-' if value is None else value!s:>{width}}"


def check_nvml(samples: int) -> dict[str, Any]:
    backend = TimedBackend(NvmlBackend())
    try:
        infos = backend.discover()
        print(f"NVML: {len(infos)} GPU(s), driver {infos[0].extra.get('driver_version') if infos else '?'}")
        for info in infos:
            print(
                f"  [{info.index}] {info.uuid}  {info.name!r} -> {info.model}, {info.memory_mib} MiB, "
                f"MIG {'on' if info.mig_mode else 'off'}, "
                f"tensor activity via {info.extra.get('tensor_active_source')}"
            )
            for device in info.mig_devices:
                print(f"      MIG {device.uuid}  {device.profile}, {device.memory_mib} MiB, GI {device.gi_id}")
        # The agent's periodic re-read of the layout (read only): nothing changed, so it must say so.
        began = time.perf_counter()
        changed = backend.inner.refresh_layout()
        print(f"layout re-read: changed={changed} in {(time.perf_counter() - began) * 1000:.1f} ms")
        messages: list[dict[str, Any]] = []
        stop = threading.Event()

        def send(message: dict[str, Any]) -> None:
            messages.append(json.loads(json.dumps(message)))
            if len(messages) >= samples:
                stop.set()

        sampler = Sampler(backend, send, node=os.uname().nodename, stop_event=stop)
        cpu0 = time.process_time()
        wall0 = time.monotonic()
        sampler.run()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        print(f"\n{len(messages)} telemetry messages at 1 Hz ({len(json.dumps(messages[-1]))} bytes each):")
        print("  seq  gpu  util%   mem MiB / total  temp°C  power W  SM MHz  tensor  procs  health / error")
        for message, took in zip(messages, backend.durations_ms, strict=False):
            _node, _ts, seq, decoded = parse_message(message)
            for index, s in enumerate(decoded):
                procs = "-" if s.processes is None else str(len(s.processes))
                problems = {k: v for k, v in s.health.items() if v not in (0, None, False)}
                print(
                    f"  {seq:3d}  {index:3d}  {fmt(s.utilization_pct, 5)}  {fmt(s.memory_used_mib, 8)} / "
                    f"{fmt(s.memory_total_mib, 6)}  {fmt(s.temperature_c, 6)}  {fmt(s.power_w, 7)}  "
                    f"{fmt(s.sm_clock_mhz, 6)}  {fmt(s.tensor_active, 6)}  {procs:>5}  "
                    f"{problems or ''} {s.error or ''}"
                )
                busy = s.mig_util or {}
                for uuid, used in (s.mig_memory or {}).items():
                    sm = f", SM {busy[uuid]}% busy (GPM)" if uuid in busy else ""
                    print(f"            MIG {uuid}: {used} MiB used{sm}")
            print(f"       sample() took {took:.2f} ms")
        print(f"  sampler CPU: {cpu * 1000:.1f} ms over {wall:.1f} s = {cpu / wall * 100:.3f}% of one core")
        return {
            "gpus": [i.to_dict() for i in infos],
            "messages": messages,
            "sample_ms": [round(d, 3) for d in backend.durations_ms],
            "sampler_cpu_pct": round(cpu / wall * 100, 4),
            "stats": sampler.stats.__dict__,
            "example_message": build_message("example", [], ts=0.0, seq=0) | {"g": messages[-1]["g"]},
        }
    finally:
        backend.close()


def check_probe(size: int | None) -> list[dict[str, Any]]:
    from workers.probes.torch_probe import ProbeUnavailable, format_result, run_probe

    try:
        import torch
    except ImportError:
        print("\ntorch probe skipped: torch is not installed")
        return []
    if not torch.cuda.is_available():
        print("\ntorch probe skipped: torch sees no CUDA device")
        return []
    results = []
    for index in range(torch.cuda.device_count()):
        print()
        try:
            result = run_probe(f"cuda:{index}", size=size)
        except ProbeUnavailable as exc:
            print(f"cuda:{index}: probe unavailable: {exc}")
            continue
        print(format_result(result))
        results.append(result.to_dict())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--size", type=int, default=None, help="probe matmul size (default 8192)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"host": os.uname().nodename, "started": time.time()}
    try:
        report["nvml"] = check_nvml(args.samples)
    except NvmlUnavailable as exc:
        print(f"device check: NVML is not usable here: {exc}", file=sys.stderr)
        return 2
    report["probe"] = [] if args.no_probe else check_probe(args.size)
    out = args.json_out or (Path(os.environ["OUT"]) / "device_check.json" if os.environ.get("OUT") else None)
    text = json.dumps(report, indent=2, default=str)
    if out is not None:
        out.write_text(text)
        print(f"\nJSON written to {out}")
    print("\n" + text)
    return 3 if any(r.get("degraded") for r in report["probe"]) else 0


if __name__ == "__main__":
    sys.exit(main())
