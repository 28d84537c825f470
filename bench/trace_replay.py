"""Replay the Alibaba GPU trace through the scheduling core in simulated time (discrete events).

Why: the scheduling policies are only as good as the waits they produce on a real workload, and the
replay must run the very code the portal runs (``apps.jobs.scheduling.schedule``), not a model of it.

    python -m bench.trace_replay --pods CSV --gpus N [--node-size G | --node-shapes G,G,..] [--nodes CSV --model-mix] \
        [--time-scale K] \
        --policy fifo|backfill|fair [--size-weight-h H] [--sharing] \
        [--gang-nodes-kept F [--long-job-h H] [--patience-h H]] [--drop-unfinished] --json

Workload (from the trace's columns): arrival = creation_time / K (``--time-scale`` compresses arrivals,
runtimes stay real); runtime = deletion_time - scheduled_time; tasks never scheduled and tasks with
num_gpu 0 are skipped, and with ``--drop-unfinished`` the tasks still running when the trace ends; the
estimate a user would give (``max_duration_s``) is max(2 x runtime, 600 s);
a fractional task (gpu_milli < 1000) takes a whole GPU, or with ``--sharing`` that share of one GPU, placed by
the core's fractional best fit (``apps.jobs.scheduling.placement.ShareState``). Team (for fair share): the
task's ``qos`` column (LS, BE, Burstable, Guaranteed): the trace has no user or team column, task names are
serial numbers, and qos is the one attribute that groups tasks by who runs them and why; all teams get equal shares.

Cluster: N GPUs in 8-GPU nodes (``--node-size``) of one model (gpu_spec ignored), or with ``--model-mix`` the node
list's models in proportion to their GPU counts (largest remainder), 8-GPU nodes per model, gpu_spec honoured
(a task whose models are absent or cannot hold its gang is skipped and counted). ``--node-shapes 8,8,8,8,8,4,2,2``
gives the nodes' sizes one by one instead (one model; the node list has nodes of 1, 2, 4 and 8 GPUs).

``--size-weight-h`` sets ``fair``'s size term (the head start, in hours of submission time, that the smallest job
gets over a month-long one; ``Policy.size_weight_s``, 24 h in the portal): how much the baseline favours short jobs.

``--gang-nodes-kept`` turns on the core's long-work rule (``apps.jobs.scheduling.longwork``, off by default as in
the portal): jobs estimated to run ``--long-job-h`` or more that leave part of a node go where long work already
is, keeping that share of the nodes clear for gangs, for up to ``--patience-h`` of waiting.

The simulator runs one scheduling pass after each batch of simultaneous events (arrivals, completions),
as the portal does on events. Output: jobs, mean/p50/p99/max wait, mean JCT, GPU allocation ratio
(allocated GPU-seconds over N x makespan), each task size's share of the mean wait (``mean_wait_by_size_s``:
"frac" for fractional tasks, "1", "2", ... GPUs otherwise; the shares add up to the mean), each size's own
waits (``waits_of_size``: jobs, mean, max, how many waited over a day) and the core's decisions per second of
scheduler time.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import heapq
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from apps.jobs.scheduling import (
    Gpu,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    UsageLedger,
    policy_by_name,
    schedule,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "alibaba-gpu-v2023"
DEFAULT_PODS = DATA / "openb_pod_list_default.csv"
DEFAULT_NODES = DATA / "openb_node_list_gpu_node.csv"
NODE_SIZE = 8
SINGLE_MODEL = "GPU"
MIN_ESTIMATE_S = 600.0


@dataclass(frozen=True, slots=True)
class TraceTask:
    """One GPU task of the trace, as the replay submits it."""

    name: str
    team: str
    arrival: float
    runtime: float
    gpu_count: int
    models: frozenset[str] | None
    gpu_milli: int = 1000  # per GPU; < 1000 only for one-GPU tasks


def load_tasks(
    pods: Path, *, time_scale: float = 1.0, drop_unfinished: bool = False
) -> tuple[list[TraceTask], dict[str, int]]:
    """The trace's GPU tasks that ran, and counts of the rows skipped and why.

    ``drop_unfinished`` skips the tasks still running when the trace ends (deletion_time is the file's last
    timestamp): their runtime is only a lower bound, and in the default list 32 of them hold 59% of all
    GPU-seconds, one GPU each for up to 145 days (docs/benchmarks.md)."""
    tasks: list[TraceTask] = []
    skipped = {"never_scheduled": 0, "no_gpu": 0}
    with pods.open(newline="") as f:
        rows = list(csv.DictReader(f))
    trace_end = max((float(r["deletion_time"]) for r in rows if r.get("deletion_time")), default=0.0)
    if drop_unfinished:
        skipped["unfinished"] = 0
    for row in rows:
        if int(row["num_gpu"]) <= 0:
            skipped["no_gpu"] += 1
            continue
        if not row.get("scheduled_time"):
            skipped["never_scheduled"] += 1
            continue
        if drop_unfinished and float(row["deletion_time"]) >= trace_end:
            skipped["unfinished"] += 1
            continue
        runtime = float(row["deletion_time"]) - float(row["scheduled_time"])
        spec = row.get("gpu_spec") or ""
        tasks.append(
            TraceTask(
                name=row["name"],
                team=row.get("qos") or "none",
                arrival=float(row["creation_time"]) / time_scale,
                runtime=max(runtime, 0.0),
                gpu_count=int(row["num_gpu"]),
                models=frozenset(spec.split("|")) if spec else None,
                gpu_milli=min(int(row.get("gpu_milli") or 1000), 1000) if int(row["num_gpu"]) == 1 else 1000,
            )
        )
    tasks.sort(key=lambda t: (t.arrival, t.name))
    return tasks, skipped


def model_mix(nodes: Path, total_gpus: int) -> dict[str, int]:
    """Split ``total_gpus`` over the node list's models in proportion to their GPU counts."""
    per_model: dict[str, int] = {}
    with nodes.open(newline="") as f:
        for row in csv.DictReader(f):
            per_model[row["model"]] = per_model.get(row["model"], 0) + int(row["gpu"])
    fleet = sum(per_model.values())
    quotas = {m: total_gpus * g / fleet for m, g in per_model.items()}
    out = {m: math.floor(q) for m, q in quotas.items()}
    by_remainder = sorted(per_model, key=lambda m: (-(quotas[m] - out[m]), m))
    for m in by_remainder[: total_gpus - sum(out.values())]:
        out[m] += 1
    return {m: n for m, n in sorted(out.items()) if n > 0}


def build_cluster(
    total_gpus: int, mix: dict[str, int] | None, node_size: int = NODE_SIZE, shapes: Sequence[int] = ()
) -> list[Gpu]:
    """N GPUs in nodes of ``node_size`` GPUs (the last node of a model may be smaller), or nodes of the sizes in
    ``shapes`` (one model)."""
    if shapes:
        return [
            Gpu(id=f"node-{n:03d}-gpu{i}", node=f"node-{n:03d}", model=SINGLE_MODEL)
            for n, size in enumerate(shapes)
            for i in range(size)
        ]
    counts = mix if mix is not None else {SINGLE_MODEL: total_gpus}
    gpus: list[Gpu] = []
    for model, count in counts.items():
        for i in range(count):
            node = f"{model.lower()}-node-{i // node_size:03d}"
            gpus.append(Gpu(id=f"{node}-gpu{i % node_size}", node=node, model=model))
    return gpus


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of sorted ``values``."""
    if not values:
        return 0.0
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def replay(
    tasks: Sequence[TraceTask],
    gpus: Sequence[Gpu],
    policy: Policy,
    *,
    records: list[tuple[TraceTask, float]] | None = None,
    sharing: bool = False,
) -> dict[str, float | int]:
    """Run the discrete-event simulation and return its metrics; ``records`` collects (task, start).
    ``sharing``: a fractional task asks for its ``gpu_milli`` of one GPU instead of a whole one."""
    free_gpu = {g.id: g for g in gpus}
    gpu_state: dict[str, Gpu] = dict(free_gpu)
    used_milli: dict[str, int] = {g.id: 0 for g in gpus}
    held_milli: dict[str, int] = {}

    def set_used(gid: str, delta: int) -> None:
        used_milli[gid] += delta
        g = free_gpu[gid]
        left = 1000 - used_milli[gid]
        gpu_state[gid] = g if left == 1000 else Gpu(g.id, g.node, g.model, g.capacity, left / 1000)

    by_id = {f"{i}": t for i, t in enumerate(tasks)}
    arrivals = [(t.arrival, job_id) for job_id, t in by_id.items()]
    arrivals.reverse()  # pop() from the end = earliest first
    pending: dict[str, PendingJob] = {}
    running: dict[str, RunningJob] = {}
    completions: list[tuple[float, str]] = []
    ledger = UsageLedger()
    waits: list[float] = []
    jcts: list[float] = []
    gpu_seconds = 0.0
    considered = 0
    passes = 0
    sched_s = 0.0
    first = tasks[0].arrival if tasks else 0.0
    last_end = first
    while arrivals or completions:
        now = min(arrivals[-1][0] if arrivals else math.inf, completions[0][0] if completions else math.inf)
        while completions and completions[0][0] <= now:
            _, job_id = heapq.heappop(completions)
            run = running.pop(job_id)
            milli = held_milli.pop(job_id)
            for gid in run.gpu_ids:
                set_used(gid, -milli)
            ledger.add(run.team, len(run.gpu_ids) * milli / 1000, run.start, now)
        while arrivals and arrivals[-1][0] <= now:
            _, job_id = arrivals.pop()
            t = by_id[job_id]
            pending[job_id] = PendingJob(
                id=job_id,
                team=t.team,
                user=t.name,
                gpu_count=t.gpu_count,
                max_duration_s=max(2.0 * t.runtime, MIN_ESTIMATE_S),
                submitted_at=t.arrival,
                models=t.models,
                gpu_milli=t.gpu_milli if sharing else 1000,
            )
        if not pending:
            continue
        usage = ledger.snapshot(
            now, ((r.team, len(r.gpu_ids) * held_milli[r.id] / 1000, r.start) for r in running.values())
        )
        snapshot = Snapshot(
            gpus=tuple(gpu_state.values()),
            pending=tuple(pending.values()),
            running=tuple(running.values()),
            team_usage=usage,
        )
        t0 = time.perf_counter()
        decisions = schedule(snapshot, policy=policy, now=now, explain=False)
        sched_s += time.perf_counter() - t0
        passes += 1
        considered += decisions.considered
        for start in decisions.starts:
            job = pending.pop(start.job_id)
            t = by_id[start.job_id]
            for gid in start.gpu_ids:
                set_used(gid, start.milli)
            held_milli[job.id] = start.milli
            running[job.id] = RunningJob(job.id, job.team, start.gpu_ids, now, job.max_duration_s)
            end = now + t.runtime
            heapq.heappush(completions, (end, job.id))
            waits.append(now - t.arrival)
            if records is not None:
                records.append((t, now))
            jcts.append(end - t.arrival)
            gpu_seconds += t.gpu_count * start.milli / 1000 * t.runtime
            last_end = max(last_end, end)
    if pending:
        raise RuntimeError(f"{len(pending)} jobs never started")
    waits.sort()
    makespan = max(last_end - first, 1e-9)
    return {
        "jobs": len(waits),
        "mean_wait_s": round(sum(waits) / max(len(waits), 1), 1),
        "p50_wait_s": round(percentile(waits, 50), 1),
        "p99_wait_s": round(percentile(waits, 99), 1),
        "max_wait_s": round(waits[-1] if waits else 0.0, 1),
        "mean_jct_s": round(sum(jcts) / max(len(jcts), 1), 1),
        "gpu_allocation_ratio": round(gpu_seconds / (len(gpus) * makespan), 4),
        "decisions_per_s": round(considered / sched_s) if sched_s > 0 else 0,
        "passes": passes,
        "scheduler_s": round(sched_s, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the CLI, replay, print the metrics."""
    parser = argparse.ArgumentParser(prog="python -m bench.trace_replay", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="pod list CSV (default: %(default)s)")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the simulated cluster")
    parser.add_argument("--node-size", type=int, default=NODE_SIZE, help="GPUs per node (default: %(default)s)")
    parser.add_argument("--node-shapes", default="", help="GPUs of each node, e.g. 8,8,8,8,8,4,2,2 (sums to --gpus)")
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="node list CSV for --model-mix")
    parser.add_argument("--model-mix", action="store_true", help="the node list's models, gpu_spec honoured")
    parser.add_argument("--time-scale", type=float, default=1.0, help="divide arrival times by K")
    parser.add_argument("--policy", choices=("fifo", "backfill", "fair"), default="fair")
    parser.add_argument(
        "--size-weight-h", type=float, default=None, help="fair's size term in hours (default: the portal's)"
    )
    parser.add_argument("--sharing", action="store_true", help="fractional tasks take their gpu_milli of one GPU")
    parser.add_argument("--gang-nodes-kept", type=float, default=0.0, help="long-work rule: share of nodes kept")
    parser.add_argument("--long-job-h", type=float, default=24.0, help="long-work rule: estimate that is long")
    parser.add_argument("--patience-h", type=float, default=1.0, help="long-work rule: the most a long job waits")
    parser.add_argument(
        "--drop-unfinished", action="store_true", help="skip the tasks still running when the trace ends"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.node_size < 1 or args.time_scale <= 0:
        parser.error("--gpus, --node-size and --time-scale must be positive")
    try:
        shapes = [int(x) for x in args.node_shapes.split(",")] if args.node_shapes else []
    except ValueError:
        parser.error("--node-shapes: GPUs per node, comma-separated")
    if shapes and (min(shapes) < 1 or sum(shapes) != args.gpus or args.model_mix):
        parser.error("--node-shapes: positive sizes adding up to --gpus, without --model-mix")
    base = policy_by_name(args.policy)
    if args.size_weight_h is not None and not base.fair_order:
        parser.error("--size-weight-h: only the fair policy orders by size")
    try:
        if args.size_weight_h is not None:
            base = dataclasses.replace(base, size_weight_s=args.size_weight_h * 3600.0)
        policy = dataclasses.replace(
            base,
            gang_nodes_kept=args.gang_nodes_kept,
            long_job_s=args.long_job_h * 3600.0,
            long_job_patience_s=args.patience_h * 3600.0,
        )
    except ValueError as exc:
        parser.error(str(exc))

    started = time.perf_counter()
    tasks, skipped = load_tasks(args.pods, time_scale=args.time_scale, drop_unfinished=args.drop_unfinished)
    if not tasks:
        parser.error(f"{args.pods}: no GPU task with creation, scheduled and deletion times to replay")
    mix = model_mix(args.nodes, args.gpus) if args.model_mix else None
    gpus = build_cluster(args.gpus, mix, args.node_size, shapes)
    if mix is None:
        tasks = [TraceTask(t.name, t.team, t.arrival, t.runtime, t.gpu_count, None, t.gpu_milli) for t in tasks]
    largest: dict[frozenset[str] | None, int] = {}
    per_node: dict[tuple[str, str], int] = {}
    for g in gpus:
        per_node[(g.node, g.model)] = per_node.get((g.node, g.model), 0) + 1
    runnable: list[TraceTask] = []
    skipped["no_fitting_node"] = 0
    for t in tasks:
        if t.models not in largest:
            largest[t.models] = max(
                (c for (_, m), c in per_node.items() if t.models is None or m in t.models), default=0
            )
        if t.gpu_count > largest[t.models]:
            skipped["no_fitting_node"] += 1
        else:
            runnable.append(t)
    records: list[tuple[TraceTask, float]] = []
    metrics = replay(runnable, gpus, policy, records=records, sharing=args.sharing)
    by_size: dict[str, float] = {}
    waits_of: dict[str, list[float]] = {}
    for task, start in records:
        size = "frac" if task.gpu_milli < 1000 else str(task.gpu_count)
        by_size[size] = by_size.get(size, 0.0) + (start - task.arrival) / len(records)
        waits_of.setdefault(size, []).append(start - task.arrival)
    order = sorted(by_size, key=lambda k: (k != "frac", int(k) if k.isdigit() else 0))
    result: dict[str, object] = {
        "policy": args.policy,
        "sharing": args.sharing,
        "size_weight_h": policy.size_weight_s / 3600.0 if policy.fair_order else None,
        "gang_nodes_kept": args.gang_nodes_kept,
        "long_job_h": args.long_job_h,
        "patience_h": args.patience_h,
        "gpus": args.gpus,
        "node_size": args.node_size,
        "node_shapes": shapes,
        "model_mix": mix if mix is not None else {SINGLE_MODEL: args.gpus},
        "time_scale": args.time_scale,
        "drop_unfinished": args.drop_unfinished,
        "pods": str(args.pods),
        "teams": "qos",
        **metrics,
        "mean_wait_by_size_s": {k: round(by_size[k], 1) for k in order},
        # Each size's own waits: a mean over all jobs can hide gangs starved for days behind small jobs' speed.
        "waits_of_size": {
            k: {
                "jobs": len(waits_of[k]),
                "mean_s": round(sum(waits_of[k]) / len(waits_of[k]), 1),
                "max_s": round(max(waits_of[k]), 1),
                "over_1d": sum(w > 86_400 for w in waits_of[k]),
            }
            for k in order
        },
        "skipped": skipped,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
