"""How fast is one scheduling pass at production scale? Prints placement decisions per second.

Why: the leader runs a pass every second and on every event; a pass that cannot keep up with a full
queue turns the scheduler into the bottleneck. Target: 5,000 placement decisions/s over the Alibaba
production fleet (1,213 nodes, 6,212 GPUs from openb_node_list_gpu_node.csv) with 10,000 pending jobs.

    python -m bench.scheduler_pass [--jobs 10000] [--passes 5] [--policy fifo|backfill|fair|all] [--json]

Pending jobs are drawn (seeded) from the default pod list: GPU count and runtime (estimate = max(2 x
runtime, 600 s)) of a random GPU task; 20% of them also get a model constraint (one model, weighted by
its GPU count, or a two-model set; the trace's own gpu_spec column is empty); teams are 8 synthetic
names. Two fleet states:

- ``empty``: every GPU free, so the pass places as many jobs as fit (the most work per job);
- ``busy``: about half the GPUs held by running jobs with expected ends over the next two days, and 20
  portal reservations (half active, half later), so backfill computes a shadow and the index has nodes
  with deadlines.

A decision is one pending job evaluated: placed, or found unable to start (with its reason);
decisions/s = evaluated jobs / median pass time over ``--passes`` runs. Strict FIFO stops evaluating at
the first job that cannot start (the rest wait behind it), so its count is smaller; ``jobs_per_s`` in the
JSON divides all pending jobs instead. The time includes building the per-pass index from the snapshot, not building the
snapshot (the ORM shell's query).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from apps.jobs.scheduling import (
    Gpu,
    PendingJob,
    Reservation,
    RunningJob,
    Snapshot,
    policy_by_name,
    schedule,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "alibaba-gpu-v2023"
NOW = 1_700_000_000.0
TEAMS = [f"team-{i}" for i in range(8)]


def load_fleet(nodes: Path) -> list[Gpu]:
    """One Gpu per GPU of the node list."""
    fleet: list[Gpu] = []
    with nodes.open(newline="") as f:
        for row in csv.DictReader(f):
            fleet.extend(Gpu(f"{row['sn']}-gpu{i}", row["sn"], row["model"]) for i in range(int(row["gpu"])))
    return fleet


def load_shapes(pods: Path) -> list[tuple[int, float]]:
    """(gpu count, runtime) of every GPU task that ran."""
    shapes: list[tuple[int, float]] = []
    with pods.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_gpu"]) > 0 and row["scheduled_time"]:
                shapes.append((int(row["num_gpu"]), float(row["deletion_time"]) - float(row["scheduled_time"])))
    return shapes


def make_pending(
    count: int, shapes: Sequence[tuple[int, float]], gpu_models: Sequence[str], seed: int
) -> list[PendingJob]:
    """``count`` pending jobs drawn from the trace's shapes; ``gpu_models`` has one entry per GPU."""
    rng = random.Random(seed)
    # A constrained job asks for the model of a random GPU (so popular models are asked for more often),
    # or for one of two multi-model sets like the trace's gpu_spec "V100M16|V100M32".
    constraints = [frozenset({m}) for m in gpu_models[:: max(len(gpu_models) // 200, 1)]]
    constraints += [frozenset({"V100M16", "V100M32"}), frozenset({"G2", "G3"})] * 10
    jobs: list[PendingJob] = []
    for i in range(count):
        gpus, runtime = rng.choice(shapes)
        jobs.append(
            PendingJob(
                id=f"job-{i:06d}",
                team=rng.choice(TEAMS),
                user=f"user-{rng.randrange(100)}",
                gpu_count=gpus,
                max_duration_s=max(2.0 * runtime, 600.0),
                submitted_at=NOW - rng.uniform(0, 3600),
                models=rng.choice(constraints) if rng.random() < 0.2 else None,
                priority=1 if rng.random() < 0.05 else 0,
            )
        )
    return jobs


def busy_state(fleet: Sequence[Gpu], seed: int) -> tuple[list[Gpu], list[RunningJob], list[Reservation]]:
    """About half the GPUs running jobs, and 20 reservations on otherwise free GPUs."""
    rng = random.Random(seed)
    by_node: dict[str, list[Gpu]] = {}
    for g in fleet:
        by_node.setdefault(g.node, []).append(g)
    running: list[RunningJob] = []
    busy: set[str] = set()
    reserved_nodes: set[str] = set()
    for node, members in by_node.items():
        held = [g for g in members if rng.random() < 0.5]
        if not held:
            continue
        busy.update(g.id for g in held)
        running.append(
            RunningJob(
                id=f"run-{node}",
                team=rng.choice(TEAMS),
                gpu_ids=tuple(g.id for g in held),
                start=NOW - rng.uniform(0, 86400),
                max_duration_s=86400 + rng.uniform(0, 2 * 86400),
            )
        )
    reservations: list[Reservation] = []
    nodes = sorted(by_node)
    for r in range(20):
        node = rng.choice(nodes)
        while node in reserved_nodes:
            node = rng.choice(nodes)
        reserved_nodes.add(node)
        free_ids = frozenset(g.id for g in by_node[node] if g.id not in busy)
        if not free_ids:
            continue
        start = NOW - 600 if r % 2 == 0 else NOW + rng.uniform(600, 6 * 3600)
        reservations.append(Reservation(f"resv-{r}", rng.choice(TEAMS), free_ids, start, start + 4 * 3600))
    gpus = [Gpu(g.id, g.node, g.model, 1.0, 0.0) if g.id in busy else g for g in fleet]
    return gpus, running, reservations


def bench(snapshot: Snapshot, policy_name: str, passes: int) -> dict[str, float | int | str]:
    """Median pass time of ``passes`` runs, as decisions/s."""
    policy = policy_by_name(policy_name)
    times: list[float] = []
    starts = evaluated = 0
    for _ in range(passes):
        t0 = time.perf_counter()
        decisions = schedule(snapshot, policy=policy, now=NOW)
        times.append(time.perf_counter() - t0)
        starts, evaluated = len(decisions.starts), decisions.considered
    median = statistics.median(times)
    return {
        "policy": policy_name,
        "pass_s": round(median, 4),
        "pass_min_s": round(min(times), 4),
        "pending": len(snapshot.pending),
        "evaluated": evaluated,
        "starts": starts,
        "decisions_per_s": round(evaluated / median),
        "jobs_per_s": round(len(snapshot.pending) / median),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Build the fleet and queue, time the passes, print the numbers."""
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_pass", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--policy", choices=("fifo", "backfill", "fair", "all"), default="all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    fleet = load_fleet(args.nodes)
    pending = tuple(make_pending(args.jobs, load_shapes(args.pods), [g.model for g in fleet], args.seed))
    gpus, running, reservations = busy_state(fleet, args.seed)
    states = {
        "empty": Snapshot(gpus=tuple(fleet), pending=pending),
        "busy": Snapshot(
            gpus=tuple(gpus),
            pending=pending,
            running=tuple(running),
            reservations=tuple(reservations),
            team_usage={t: 3600.0 * (i + 1) for i, t in enumerate(TEAMS)},
        ),
    }
    policies = ("fifo", "backfill", "fair") if args.policy == "all" else (args.policy,)
    rows = []
    for state, snapshot in states.items():
        for name in policies:
            rows.append({"state": state, **bench(snapshot, name, args.passes)})
    header = {"nodes": len({g.node for g in fleet}), "gpus": len(fleet), "pending": len(pending)}
    if args.json:
        print(json.dumps({**header, "passes": args.passes, "results": rows}))
    else:
        print(
            f"{header['nodes']} nodes, {header['gpus']} GPUs, {header['pending']} pending jobs, "
            f"median of {args.passes} passes"
        )
        print(f"{'state':6} {'policy':9} {'pass s':>8} {'evaluated':>9} {'starts':>7} {'decisions/s':>12}")
        for r in rows:
            print(
                f"{r['state']:6} {r['policy']:9} {r['pass_s']:8.3f} {r['evaluated']:9d} {r['starts']:7d} "
                f"{r['decisions_per_s']:12,d}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
