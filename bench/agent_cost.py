"""CPU cost of the node agent's telemetry: sampling N simulated GPUs at 1 Hz through the real Sampler and
serializing each message to JSON, as the agent does before handing it to the broker.

    .venv/bin/python -m bench.agent_cost [--seconds 30] [--gpus 8] [--busy 4] [--period 1.0]

Prints process CPU time per wall second as a percentage of one core (target: under 1%), the message size, and
the CPU cost of one tick measured back to back. The simulated backend costs more CPU per GPU than NVML reads do
(it runs a small physical model and a random generator per GPU); the NVML backend's cost is dominated by the
driver, not by Python, and is measured on a GPU node with bench/device_check.py.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from workers.gpu.base import build_message
from workers.gpu.simulated import SimulatedBackend, job_profiles
from workers.sampler import Sampler


def build_backend(gpus: int, busy: int, model: str, seed: int) -> SimulatedBackend:
    backend = SimulatedBackend("bench-node", [model] * gpus, seed=seed)
    profiles = job_profiles()
    for i, info in enumerate(backend.discover()[:busy]):
        backend.assign(info.uuid, f"job-{i}", profiles[i % len(profiles)])
    return backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="wall time of the 1 Hz run")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--busy", type=int, default=4, help="how many GPUs run a trace profile")
    parser.add_argument("--model", default="A100-80GB")
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--tight-ticks", type=int, default=2_000, help="ticks for the back-to-back measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # 1. Back-to-back: the CPU one tick costs, without the sleeping in between.
    backend = build_backend(args.gpus, args.busy, args.model, args.seed)
    t0 = 1_767_225_600.0
    backend.sample(t0)  # first call loads the profiles; not part of the steady state
    cpu0 = time.process_time()
    size = 0
    for k in range(1, args.tight_ticks + 1):
        size = len(
            json.dumps(build_message("bench-node", backend.sample(t0 + k), ts=t0 + k, seq=k), separators=(",", ":"))
        )
    per_tick_us = (time.process_time() - cpu0) / args.tight_ticks * 1e6

    # 2. The real thing: the Sampler's 1 Hz loop in its thread, JSON-serializing each message.
    backend = build_backend(args.gpus, args.busy, args.model, args.seed)
    sizes: list[int] = []

    def send(message: dict[str, Any]) -> None:
        sizes.append(len(json.dumps(message, separators=(",", ":"))))

    sampler = Sampler(backend, send, node="bench-node", period_s=args.period)
    backend.sample(time.time())
    wall0, cpu0 = time.monotonic(), time.process_time()
    sampler.start()
    stop = threading.Event()
    stop.wait(args.seconds)
    sampler.stop()
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    stats = sampler.stats

    print(
        f"agent telemetry cost: {args.gpus} simulated {args.model} ({args.busy} busy), "
        f"period {args.period:g} s, {wall:.1f} s wall"
    )
    print(
        f"  ticks {stats.ticks}, sent {stats.sent}, send failures {stats.send_failures}, skipped {stats.skipped_ticks}"
    )
    print(f"  message size: {sizes[-1] if sizes else size} bytes of JSON ({size} in the tight loop)")
    print(f"  one tick back to back: {per_tick_us:.0f} us CPU (sample {args.gpus} GPUs + build + json.dumps)")
    print(
        f"  process CPU while sampling at 1 Hz: {cpu * 1000:.1f} ms in {wall:.1f} s = "
        f"{cpu / wall * 100:.3f}% of one core (target < 1%)"
    )


if __name__ == "__main__":
    main()
