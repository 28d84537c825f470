"""Where a fraction of a GPU goes: best fit that keeps whole GPUs and whole nodes free for gangs.

"Beware of Fragmentation" (USENIX ATC 2023) shows that on a cluster shared by fractional and multi-GPU tasks,
fragmentation, not demand, leaves GPUs unusable: a GPU with 0.3 free cannot take a 0.5 task, and a node whose
eight GPUs each hold a quarter task cannot take an 8-GPU gang although it has six GPUs' worth free. The rules
here follow from that, in order:

1. a fraction goes on a GPU that is already shared, if one fits, so whole GPUs stay whole;
2. among those, the one it fills most tightly (least left over), so the remainders stay large enough to use;
3. only when no shared GPU fits does it open a whole GPU, and then on the node with the fewest whole GPUs left,
   so the nodes with many whole GPUs stay free for gangs.

Gangs (multi-GPU jobs) take whole GPUs only, by the node left with the fewest free GPUs (`best_fit_whole`, the
same rule as ``placement.ClusterState.find``). Pure functions over plain numbers: no Django, no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MILLI = 1000
"""Shares are counted in thousandths of a GPU (the trace's ``gpu_milli``), so sums stay exact."""


@dataclass(frozen=True, slots=True)
class ShareCandidate:
    """A GPU that could take a fraction: its node, its index, what is free on it and on its node."""

    node: int
    gpu: int
    free_milli: int
    node_whole_free: int


def best_fit_share(candidates: Iterable[ShareCandidate], need_milli: int) -> ShareCandidate | None:
    """The GPU a fraction of ``need_milli`` should take, or None when none has that much free."""
    if not 0 < need_milli <= MILLI:
        raise ValueError(f"a share is 1..{MILLI} milli-GPUs, not {need_milli}")
    best: ShareCandidate | None = None
    best_key: tuple[int, int, int, int, int] | None = None
    for c in candidates:
        if c.free_milli < need_milli:
            continue
        opens_whole = 1 if c.free_milli >= MILLI else 0
        key = (opens_whole, c.free_milli - need_milli, c.node_whole_free, c.node, c.gpu)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


def best_fit_whole(whole_free_by_node: Mapping[int, int], count: int) -> int | None:
    """The node a gang of ``count`` whole GPUs should take: the one left with the fewest free, or None."""
    if count < 1:
        raise ValueError("a gang needs at least one GPU")
    best: int | None = None
    for node, free in whole_free_by_node.items():
        if free < count:
            continue
        if best is None or (free, node) < (whole_free_by_node[best], best):
            best = node
    return best
