"""Build alibaba_genai_2026.json: compact GPU-usage profiles for the simulated backend from a real trace.

Source: alibaba/clusterdata, cluster-trace-v2026-GenAI, the two per-container series
`pod_gpu_duty_cycle_anon` (GPU duty cycle, percent) and `pod_gpu_memory_used_bytes_anon` (bytes), one point per
container every 57 s, 143 containers over ~23 hours. See README.md in this folder.

    python workers/gpu/profiles/build_profiles.py [--data DIR] [--out FILE] [--points N]

Deterministic: the same input gives byte-identical output (the containers are chosen by id below, not sampled).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[2].parent / "shared" / "data" / "alibaba-genai-2026"
DEFAULT_OUT = HERE / "alibaba_genai_2026.json"

STEP_S = 57  # the trace's sampling interval (timestamps advance by 57 s, not 60)
MEM_REF_MIB = 81_920  # memory is stored as a fraction of an 80 GiB board: the trace peaks at 47 GiB used
DEFAULT_POINTS = 360  # ~5.7 h per profile; the simulator loops a profile that runs out

# (profile name, container id prefix, kind, tensor-pipe share of busy time, why it was picked).
# Picked by hand from the per-container summary that `--survey` prints: the trace has a few heavy, bursty
# training-like containers, a large group of light steady services, short batch runs, and containers that hold
# 17-25 GiB of memory while doing almost nothing (the idle-detection case the portal exists for).
SELECTION: tuple[tuple[str, str, str, float, str], ...] = (
    ("train-heavy-a", "2e6ae913", "training", 0.60, "highest mean duty (28%), bursts to 98%, 27-42 GiB"),
    ("train-heavy-b", "2a2ad10c", "training", 0.60, "mean 27%, bursty, memory swings 10-40 GiB"),
    ("train-periodic", "3ed83727", "training", 0.55, "mean 20%, busy phases separated by quiet stretches"),
    ("train-mixed", "23b8eba9", "training", 0.50, "mean 12%, regular bursts to 98%, 25-43 GiB"),
    ("train-sparse", "9cd20d9c", "training", 0.50, "mean 10%, sparse bursts"),
    ("inference-steady-a", "4d8eab03", "inference", 0.30, "the large group: mean 5%, many small blips"),
    ("inference-steady-b", "c602ea5b", "inference", 0.30, "same group, occasional spikes to 99%"),
    ("batch-short", "0e1fe71a", "batch", 0.40, "lived 6 h, active half of the minutes at low duty"),
    ("dev-notebook", "5245a27b", "interactive", 0.20, "mean 5%, irregular, memory 15-40 GiB"),
    ("idle-holding-a", "87b9247b", "idle", 0.0, "17 GiB held for 23 h, duty 0 except one blip"),
    ("idle-holding-b", "673d3687", "idle", 0.0, "18 GiB held for 23 h, two short blips"),
    ("idle-mostly", "94fab3af", "idle", 0.10, "22-24 GiB held, duty 0.3% on average"),
)


def _rows(tar_path: Path) -> Iterator[dict[str, str]]:
    with tarfile.open(tar_path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".csv"):
                handle = tar.extractfile(member)
                assert handle is not None
                yield from csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8"))


def load(data_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """Per container: {timestamp: duty %} and {timestamp: memory bytes}."""
    duty: dict[str, dict[int, float]] = defaultdict(dict)
    mem: dict[str, dict[int, float]] = defaultdict(dict)
    for row in _rows(data_dir / "pod_gpu_duty_cycle_anon.tar.gz"):
        duty[row["container_ip"]][int(float(row["timestamp_anon"]))] = float(row["value"])
    for row in _rows(data_dir / "pod_gpu_memory_used_bytes_anon.tar.gz"):
        mem[row["container_ip"]][int(float(row["timestamp_anon"]))] = float(row["value"])
    return duty, mem


def series(duty: dict[int, float], mem: dict[int, float], points: int) -> tuple[list[int], list[int]]:
    """Regular 57 s series from the container's first point: duty as integer %, memory as permille of 80 GiB.

    A missing duty point counts as 0 (no evidence of work); a missing memory point repeats the previous one,
    because allocated memory does not vanish between two scrapes.
    """
    start = min(min(duty), min(mem)) if mem else min(duty)
    end = max(duty)
    util: list[int] = []
    memory: list[int] = []
    last_mem = 0.0
    t = start
    while t <= end and len(util) < points:
        util.append(max(0, min(100, round(duty.get(t, 0.0)))))
        last_mem = mem.get(t, last_mem)
        memory.append(max(0, min(1000, round(last_mem / (MEM_REF_MIB * 1024 * 1024) * 1000))))
        t += STEP_S
    return util, memory


def survey(duty: dict[str, dict[int, float]], mem: dict[str, dict[int, float]]) -> None:
    """Print one line per container: the table the selection above was made from."""
    print("container  points  mean%  max%  active  mem_mean_GiB  mem_max_GiB")
    rows = []
    for cid, d in duty.items():
        values = list(d.values())
        m = list(mem.get(cid, {}).values()) or [0.0]
        rows.append(
            (
                statistics.mean(values),
                cid[:8],
                len(values),
                max(values),
                sum(v > 0 for v in values) / len(values),
                statistics.mean(m) / 2**30,
                max(m) / 2**30,
            )
        )
    for mean, cid, n, peak, active, mmean, mmax in sorted(rows):
        print(f"{cid}  {n:6d}  {mean:5.1f}  {peak:4.0f}  {active:6.2f}  {mmean:12.1f}  {mmax:11.1f}")


def build(data_dir: Path, points: int) -> dict[str, object]:
    duty, mem = load(data_dir)
    profiles: dict[str, object] = {}
    for name, prefix, kind, tensor_ratio, why in SELECTION:
        matches = [cid for cid in duty if cid.startswith(prefix)]
        if len(matches) != 1:
            raise SystemExit(f"container prefix {prefix!r} matches {len(matches)} containers")
        cid = matches[0]
        util, memory = series(duty[cid], mem.get(cid, {}), points)
        profiles[name] = {
            "container": prefix,
            "kind": kind,
            "tensor_ratio": tensor_ratio,
            "note": why,
            "util": util,
            "mem": memory,
        }
    return {
        "source": "alibaba/clusterdata cluster-trace-v2026-GenAI: pod_gpu_duty_cycle_anon, "
        "pod_gpu_memory_used_bytes_anon",
        "step_s": STEP_S,
        "mem_ref_mib": MEM_REF_MIB,
        "units": {"util": "GPU duty cycle, integer percent", "mem": "memory used, permille of mem_ref_mib"},
        "profiles": profiles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with the two .tar.gz files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--points", type=int, default=DEFAULT_POINTS, help="points per profile (57 s each)")
    parser.add_argument("--survey", action="store_true", help="print the per-container summary and exit")
    args = parser.parse_args()
    if args.survey:
        survey(*load(args.data))
        return
    doc = build(args.data, args.points)
    # One profile per line: small, and diffs of a rebuild stay readable.
    profiles = doc.pop("profiles")
    assert isinstance(profiles, dict)
    lines = [json.dumps(doc, separators=(",", ":"))[:-1] + ',"profiles":{']
    items = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}" for k, v in profiles.items()]
    lines.append(",\n".join(items))
    lines.append("}}\n")
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(profiles)} profiles)")


if __name__ == "__main__":
    main()
