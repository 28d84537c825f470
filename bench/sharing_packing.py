"""FGD's packing experiment on the Alibaba GPU trace: how much GPU capacity does each allocation leave unusable?

"Beware of Fragmentation" (USENIX ATC 2023) fills the cluster of `openb_node_list_gpu_node.csv` (1,213 nodes,
6,212 GPUs) with the tasks of a pod list in file order, never releasing any, until the first task that does not
fit, and then measures the GPU capacity nobody holds. Fragmentation, not demand, is what leaves it unallocated: a
GPU with 0.3 free cannot take a 0.5 task, a node with three free GPUs cannot take a 4-GPU gang.

Three allocations on the same cluster and the same task order:

- ``whole``: every GPU task gets whole GPUs (a 0.25 task holds a GPU), nodes chosen by the portal's gang best fit;
- ``share-first-fit``: fractional tasks share GPUs; each task takes the first node and GPU that fit;
- ``share-best-fit``: fractional tasks share GPUs, placed by the portal's scheduler core
  (``apps.jobs.scheduling.sharing``: a fraction fills an already shared GPU most tightly before it opens a whole
  one; gangs take the node left with the fewest free GPUs).

Two cluster models, both printed: ``gpus`` counts GPUs only (a task fits where its GPUs fit), ``hosts`` also
needs each task's CPU and memory free on its node, as the paper's simulator does. "Unallocated" is the capacity
no placed task asked for: free GPUs, free remainders of shared ones, and under whole-GPU allocation the part of
a GPU a fractional task holds but did not ask for.

    .venv/bin/python bench/sharing_packing.py                      # both files
    .venv/bin/python bench/sharing_packing.py --pods openb_pod_list_gpushare40.csv

Prints one line per (file, allocation) with the tasks placed, the task that stopped it and the share of the
cluster's GPU capacity left unallocated; the last lines compare each sharing allocation with ``whole``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.jobs.scheduling.sharing import ShareCandidate, best_fit_share, best_fit_whole  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"
MILLI = 1000


@dataclass
class Node:
    name: str
    model: str
    cpu_free: int
    mem_free: int
    gpu_free: list[int] = field(default_factory=list)  # free milli-GPU per GPU


@dataclass(frozen=True)
class Task:
    name: str
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int  # per GPU; < 1000 only for 1-GPU tasks


def load_nodes(path: Path) -> list[Node]:
    with path.open() as f:
        return [
            Node(r["sn"], r["model"], int(r["cpu_milli"]), int(r["memory_mib"]), [MILLI] * int(r["gpu"]))
            for r in csv.DictReader(f)
        ]


def load_tasks(path: Path) -> list[Task]:
    with path.open() as f:
        return [
            Task(r["name"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["num_gpu"]), int(r["gpu_milli"]))
            for r in csv.DictReader(f)
        ]


Placer = Callable[[list[Node], Task], tuple[int, list[int]] | None]
"""Chooses (node index, GPU indexes on it) for a task, or None when it fits nowhere."""


CHECK_HOSTS = True
"""Whether a task needs its CPU and memory free on the node (the ``hosts`` model) or only its GPUs (``gpus``)."""


def _fits_host(node: Node, task: Task) -> bool:
    return not CHECK_HOSTS or (node.cpu_free >= task.cpu and node.mem_free >= task.mem)


def first_fit(nodes: list[Node], task: Task) -> tuple[int, list[int]] | None:
    for n, node in enumerate(nodes):
        if not _fits_host(node, task):
            continue
        if task.num_gpu == 0:
            return n, []
        if task.gpu_milli < MILLI:
            for g, free in enumerate(node.gpu_free):
                if free >= task.gpu_milli:
                    return n, [g]
            continue
        whole = [g for g, free in enumerate(node.gpu_free) if free == MILLI]
        if len(whole) >= task.num_gpu:
            return n, whole[: task.num_gpu]
    return None


def _portal(nodes: list[Node], task: Task, share: bool) -> tuple[int, list[int]] | None:
    hosts = [n for n, node in enumerate(nodes) if _fits_host(node, task)]
    if not hosts:
        return None
    if task.num_gpu == 0:
        # A CPU-only task goes where it strands the fewest GPUs: the host with the fewest free GPUs.
        return min(hosts, key=lambda n: (sum(1 for f in nodes[n].gpu_free if f == MILLI), n)), []
    if share and task.gpu_milli < MILLI:
        candidates = [
            ShareCandidate(node=n, gpu=g, free_milli=free, node_whole_free=_whole_free(nodes[n]))
            for n in hosts
            for g, free in enumerate(nodes[n].gpu_free)
            if free >= task.gpu_milli
        ]
        chosen = best_fit_share(candidates, task.gpu_milli)
        return None if chosen is None else (chosen.node, [chosen.gpu])
    count = task.num_gpu
    free_by_node = {n: [g for g, f in enumerate(nodes[n].gpu_free) if f == MILLI] for n in hosts}
    n_best = best_fit_whole({n: len(gs) for n, gs in free_by_node.items()}, count)
    return None if n_best is None else (n_best, free_by_node[n_best][:count])


def _whole_free(node: Node) -> int:
    return sum(1 for f in node.gpu_free if f == MILLI)


def whole_gpus(nodes: list[Node], task: Task) -> tuple[int, list[int]] | None:
    as_whole = Task(task.name, task.cpu, task.mem, task.num_gpu, MILLI) if task.num_gpu else task
    return _portal(nodes, as_whole, share=False)


def share_best_fit(nodes: list[Node], task: Task) -> tuple[int, list[int]] | None:
    return _portal(nodes, task, share=True)


@dataclass
class Result:
    placed: int
    stopped_by: Task | None
    capacity_milli: int
    held_milli: int  # held by some task: a 0.25 task under whole-GPU allocation holds 1000
    requested_milli: int  # what the placed tasks asked for: the 0.25 task counts 250

    @property
    def unallocated(self) -> float:
        """Capacity no task's request covers: free GPUs plus what whole-GPU allocation strands inside them."""
        return 1.0 - self.requested_milli / self.capacity_milli

    @property
    def free(self) -> float:
        """Capacity nobody holds (free GPUs and free remainders of shared ones)."""
        return 1.0 - self.held_milli / self.capacity_milli


def pack(nodes: list[Node], tasks: list[Task], placer: Placer, whole: bool) -> Result:
    capacity = sum(len(n.gpu_free) for n in nodes) * MILLI
    held = requested = 0
    for placed, task in enumerate(tasks):
        where = placer(nodes, task)
        if where is None:
            return Result(placed, task, capacity, held, requested)
        n, gpus = where
        node = nodes[n]
        node.cpu_free -= task.cpu
        node.mem_free -= task.mem
        take = MILLI if whole or task.gpu_milli >= MILLI else task.gpu_milli
        for g in gpus:
            assert node.gpu_free[g] >= take, (task, node.gpu_free[g])
            node.gpu_free[g] -= take
            held += take
            requested += task.gpu_milli
    return Result(len(tasks), None, capacity, held, requested)


ALLOCATIONS: dict[str, tuple[Placer, bool]] = {
    "whole": (whole_gpus, True),
    "share-first-fit": (first_fit, False),
    "share-best-fit": (share_best_fit, False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pods", action="append", help="pod list(s) in the data folder (default: multigpu50 and gpushare40)"
    )
    parser.add_argument("--nodes", default="openb_node_list_gpu_node.csv")
    args = parser.parse_args()
    pod_files = args.pods or ["openb_pod_list_multigpu50.csv", "openb_pod_list_gpushare40.csv"]
    global CHECK_HOSTS
    for model, check_hosts in (("gpus", False), ("hosts", True)):
        CHECK_HOSTS = check_hosts
        for pod_file in pod_files:
            run(pod_file, model, args.nodes)


def run(pod_file: str, model: str, node_file: str) -> None:
    tasks = load_tasks(DATA / pod_file)
    results: dict[str, Result] = {}
    for name, (placer, whole) in ALLOCATIONS.items():
        nodes = load_nodes(DATA / node_file)
        started = time.perf_counter()
        result = pack(nodes, tasks, placer, whole)
        results[name] = result
        stop = result.stopped_by
        print(
            f"[{model}] {pod_file} {name:16s} placed {result.placed:5d}/{len(tasks)} tasks; "
            f"unallocated {result.unallocated * 100:5.2f}% of {result.capacity_milli // MILLI} GPUs "
            f"(free {result.free * 100:5.2f}%); "
            f"stopped by {stop.name if stop else '-'} "
            f"({stop.num_gpu if stop else 0} GPU x {stop.gpu_milli if stop else 0} milli) "
            f"[{time.perf_counter() - started:.1f} s]",
            flush=True,
        )
    base = results["whole"].unallocated
    for name in ("share-first-fit", "share-best-fit"):
        cut = (1 - results[name].unallocated / base) * 100 if base else 0.0
        print(f"[{model}] {pod_file} {name}: {cut:.1f}% less capacity unallocated than whole GPUs")


if __name__ == "__main__":
    main()
