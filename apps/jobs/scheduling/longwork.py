"""Long work that leaves part of a node goes where long work already is, so gangs keep whole nodes.

Why: a gang needs all its GPUs on one node, so one long one-GPU job (a notebook left running for weeks, a
slow sweep) makes a whole node useless to gangs for as long as it runs. Best fit cannot prevent it: at the
moment such a job starts, the nodes that long work already holds are often full of short jobs, and best fit
opens the next node. Replaying the Alibaba trace on six 8-GPU nodes, 22 one-GPU tasks that ran for months
ended up on five different nodes, and every 8-GPU gang that arrived after them waited weeks (docs/benchmarks.md).
Slurm sites get the same effect by hand with a "long" partition limited to part of the cluster.

The rule, for a job estimated to run at least ``Policy.long_job_s`` that leaves part of a node (fewer GPUs
than the largest node it could use, or a fraction of one):

1. it goes on a node that long work already holds (a running job there is expected to hold GPUs for at least
   ``long_job_s`` more), if one has room;
2. otherwise it may open another node only while more than ``Policy.gang_nodes_kept`` of the multi-GPU nodes
   stay clear of long work; else it waits for room on the nodes long work already holds.

The number of nodes kept clear is rounded down, so a fleet of one or two multi-GPU nodes keeps none with the
default third: long work is never barred from the whole fleet. Short jobs and whole-node gangs are not affected.
"""

from __future__ import annotations

import math
from collections.abc import Set

from apps.jobs.scheduling.model import PendingJob, Snapshot
from apps.jobs.scheduling.placement import EPS, ClusterState


class LongWork:
    """Which nodes long work holds in this pass, and where a long job that leaves part of a node may go."""

    def __init__(
        self, snapshot: Snapshot, state: ClusterState, *, long_job_s: float, nodes_kept: float, patience_s: float
    ) -> None:
        self.state = state
        self.long_job_s = long_job_s
        self.patience_s = patience_s
        horizon = state.now + long_job_s
        self.held: set[int] = set()
        for run in snapshot.running:
            if run.expected_end < horizon - EPS:
                continue
            for gid in run.gpu_ids:
                i = state.index_of.get(gid)
                if i is not None:
                    self.held.add(state.gpu_node[i])
        self.gang_nodes = frozenset(n for n, members in enumerate(state.node_gpus) if len(members) >= 2)
        self.keep = math.floor(nodes_kept * len(self.gang_nodes) + EPS) if long_job_s > 0.0 else 0
        # Nodes that can never take a gang are as good a home for long work as the nodes it already holds.
        self.home: set[int] = self.held | (set(range(len(state.node_gpus))) - self.gang_nodes)

    def applies_to(self, job: PendingJob) -> bool:
        """Is the job long work that leaves part of a node?"""
        if self.keep == 0 or job.max_duration_s < self.long_job_s - EPS:
            return False
        if self.state.now - job.submitted_at >= self.patience_s - EPS:
            return False
        return job.gpu_milli < 1000 or job.gpu_count < self.state.largest_gang(job.models)

    def may_open(self) -> bool:
        """May long work start on a node it does not hold yet (more than ``keep`` nodes are still clear)?"""
        return len(self.gang_nodes - self.held) > self.keep

    def homes(self) -> Set[int]:
        """The nodes long work already holds, plus those no gang could use."""
        return self.home

    def took(self, node: int) -> None:
        """Long work started on ``node``."""
        self.held.add(node)
        self.home.add(node)
