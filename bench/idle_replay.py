"""Replay the Alibaba GenAI trace's per-container GPU duty cycle and memory through the idle detector.

Why: the idle policy's defaults must reclaim most of the GPU time a reservation holds idle, without taking GPUs
from people who are using them. The replay runs the very decision the portal runs (``apps.efficiency.detector``:
minute kinds, the streak, warn-before-reclaim, the loaded GPU's longer limit, unused release), minute by minute.

    python -m bench.idle_replay [--data DIR] [--model A100-80GB] [--json]

Workload: ``pod_gpu_duty_cycle_anon.csv`` (value = duty cycle %, one sample a minute per container) and
``pod_gpu_memory_used_bytes_anon.csv`` (bytes), from ``DIR`` (the trace's ``.tar.gz`` files are read as they are).
Each container is one reservation of one simulated GPU of ``--model`` (its memory and demo price, from
apps/booking/demo.py) over the span of its samples; a minute without a duty-cycle sample is unknown (never idle).

Figures:
- idle reserved GPU-hours: minutes below the policy's utilization threshold (loaded or empty);
- reclaimed: the reservation's idle minutes after the reclaim (what the release frees), and their share;
- false reclaims: reclaims (and the GPU-hours they took) of containers with a busy minute inside the window the
  reclaim was judged on, the grace after the warning: must be zero (checked here apart from the decision). Bursts
  inside the longer window before the warning are counted too (``reclaims_with_bursts_in_the_warning_window``):
  the mean over that window is what the policy judges, by design;
- busy after reclaim: minutes the container was busy after it was reclaimed (work a holder would have to restart
  elsewhere: the price of reclaiming), reported, not hidden;
- cost saved: reclaimed idle GPU-hours at the model's demo price.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from apps.efficiency.detector import Action, Minute, MinuteKind, Sample, Thresholds, combine, decide, unused, window_of

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-genai-2026"
MIB = 1024 * 1024


def _rows(data: Path, stem: str) -> Iterator[dict[str, str]]:
    plain = data / f"{stem}.csv"
    if plain.exists():
        with plain.open() as f:
            yield from csv.DictReader(f)
        return
    with tarfile.open(data / f"{stem}.tar.gz") as tar:
        for member in tar:
            if member.name.endswith(".csv"):
                handle = tar.extractfile(member)
                assert handle is not None
                yield from csv.DictReader(io.TextIOWrapper(handle))


def load(data: Path) -> dict[str, dict[int, tuple[float | None, float | None]]]:
    """{container: {minute: (duty %, memory MiB)}}."""
    duty: dict[str, dict[int, float]] = defaultdict(dict)
    mem: dict[str, dict[int, float]] = defaultdict(dict)
    for r in _rows(data, "pod_gpu_duty_cycle_anon"):
        duty[r["container_ip"]][int(float(r["timestamp_anon"])) // 60] = float(r["value"])
    for r in _rows(data, "pod_gpu_memory_used_bytes_anon"):
        mem[r["container_ip"]][int(float(r["timestamp_anon"])) // 60] = float(r["value"]) / MIB
    out: dict[str, dict[int, tuple[float | None, float | None]]] = {}
    for c, series in duty.items():
        minutes = set(series) | set(mem.get(c, {}))
        out[c] = {m: (series.get(m), mem.get(c, {}).get(m)) for m in minutes}
    return out


@dataclass
class Outcome:
    minutes: int = 0
    idle: int = 0
    reclaimed_idle: int = 0
    reclaimed_total: int = 0
    busy_after: int = 0
    false_reclaim: int = 0
    warnings: int = 0
    reclaims: int = 0
    unused: int = 0
    bursty_window: int = 0


def replay_one(series: dict[int, tuple[float | None, float | None]], th: Thresholds, mem_total: float) -> Outcome:
    first, last = min(series), max(series)
    minutes: list[Minute] = []
    out = Outcome()
    warned_at: int | None = None
    reclaimed_at: int | None = None
    for i, m in enumerate(range(first, last + 1)):
        util, mem = series.get(m, (None, None))
        minute = combine([Sample(util=util, mem_used=mem, mem_total=mem_total) if util is not None else None], th)
        minutes.append(minute)
        idle = util is not None and util < th.utilization_below_pct
        out.minutes += 1
        out.idle += idle
        if reclaimed_at is not None:
            out.reclaimed_total += 1
            out.reclaimed_idle += idle
            out.busy_after += minute.kind == MinuteKind.BUSY
            continue
        if i + 1 == th.unused_release_after_min and unused(minutes, th):
            reclaimed_at = i
            out.unused += 1
            continue
        v = decide(minutes, th, warned_for=None if warned_at is None else i - warned_at)
        if v.action == Action.WARN:
            warned_at = i
            out.warnings += 1
        elif v.action == Action.CLEAR:
            warned_at = None
        elif v.action == Action.RECLAIM:
            reclaimed_at = i
            out.reclaims += 1
            # Checked apart from the decision: a busy minute in the grace window (after the warning)?
            assert warned_at is not None
            if any(k.kind == MinuteKind.BUSY for k in minutes[warned_at + 1 :]):
                out.false_reclaim += 1
            # For the record, not a false reclaim: bursts inside the window the warning was judged on.
            if any(k.kind == MinuteKind.BUSY for k in minutes[max(0, warned_at + 1 - v.window_min) : warned_at + 1]):
                out.bursty_window += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default="A100-80GB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from apps.booking.demo import MODELS

    spec = {name: (memory, price) for name, _, memory, price in MODELS}
    mem_total, price = spec[args.model]
    th = Thresholds()
    total = Outcome()
    per_container = load(args.data)
    false_hours = 0
    for series in per_container.values():
        o = replay_one(series, th, float(mem_total))
        for f in total.__dataclass_fields__:
            setattr(total, f, getattr(total, f) + getattr(o, f))
        if o.false_reclaim:
            false_hours += o.reclaimed_total
    idle_h = total.idle / 60
    result = {
        "containers": len(per_container),
        "policy": {
            **th.__dict__,
            "window_min_empty": window_of(th, loaded=False),
            "window_min_loaded": window_of(th, loaded=True),
        },
        "model": args.model,
        "reserved_gpu_hours": round(total.minutes / 60, 1),
        "idle_reserved_gpu_hours": round(idle_h, 1),
        "reclaimed_idle_gpu_hours": round(total.reclaimed_idle / 60, 1),
        "reclaimed_share_of_idle": round(total.reclaimed_idle / total.idle, 3) if total.idle else 0.0,
        "reclaimed_gpu_hours": round(total.reclaimed_total / 60, 1),
        "false_reclaims": total.false_reclaim,
        "false_reclaim_gpu_hours": round(false_hours / 60, 1),
        "busy_gpu_hours_after_reclaim": round(total.busy_after / 60, 1),
        "warnings": total.warnings,
        "reclaims": total.reclaims,
        "reclaims_with_bursts_in_the_warning_window": total.bursty_window,
        "released_unused": total.unused,
        "cost_saved": str((Decimal(total.reclaimed_idle) / 60 * price).quantize(Decimal("0.01"))),
        "hourly_price": str(price),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
