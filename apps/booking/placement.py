"""Which concrete GPUs a booking of N GPUs gets: a plain function of the free GPUs (no ORM).

Rules, in order: all N on one node where any node has N free; among those, the node where the fewest GPUs split in
shares are taken (`last`: a whole booking takes one only when it must), then the fewest GPUs something outside the
portal uses now (for a booking that starts now: it would share their memory), then best fit (the node left with the
fewest free GPUs), so whole 8-GPU nodes stay whole for the bookings that need them; ties go to the node that is
already partly in use, then by name. Within a node, a run of consecutive indices when there is one (GPUs next to
each other usually share a switch), the GPUs in use outside the portal and then the split ones only as needed. Only
when no node has N free, and the policy allows it, the booking spans
nodes: the fewest nodes, largest first, the last one again by best fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class FreeGpu:
    """A GPU free for the whole window."""

    id: int
    node: str
    index: int
    last: bool = False  # split in shares: taken only where the node's other free GPUs are not enough
    # Something outside the portal uses its memory now (a booking that starts now would share it): taken only where
    # the node's other free GPUs are not enough, before a split one (as the scheduling core orders them).
    in_use_outside: bool = False


def _pick_in_node(gpus: Sequence[FreeGpu], count: int) -> list[int]:
    """`count` GPUs of one node: the GPUs neither split nor in use outside the portal first (a run of consecutive
    indices where they have one), then ones in use outside the portal, then split ones, each by index."""
    tiers: dict[tuple[bool, bool], list[FreeGpu]] = {}
    for gpu in gpus:
        tiers.setdefault((gpu.last, gpu.in_use_outside), []).append(gpu)
    chosen: list[FreeGpu] = []
    for tier in sorted(tiers):
        group, left = tiers[tier], count - len(chosen)
        if not chosen and len(group) >= left:
            return _pick_run(group, left)
        chosen += sorted(group, key=lambda g: g.index)[:left]
        if len(chosen) == count:
            break
    return [g.id for g in sorted(chosen, key=lambda g: g.index)]  # the devices in index order, whatever their tier


def _pick_run(gpus: Sequence[FreeGpu], count: int) -> list[int]:
    ordered = sorted(gpus, key=lambda g: g.index)
    runs: list[list[FreeGpu]] = []
    for gpu in ordered:
        if runs and gpu.index == runs[-1][-1].index + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    fitting = [run for run in runs if len(run) >= count]
    if fitting:
        best = min(fitting, key=lambda run: (len(run), run[0].index))
        return [g.id for g in best[:count]]
    return [g.id for g in ordered[:count]]


def place(
    free: Sequence[FreeGpu], count: int, node_sizes: Mapping[str, int] | None = None, *, allow_multi_node: bool = True
) -> list[int] | None:
    """Ids of `count` GPUs from `free`, or None when they cannot be found. `node_sizes` = GPUs per node in
    total (free or not), used to prefer partly used nodes over untouched ones on a tie."""
    if count <= 0:
        return None
    by_node: dict[str, list[FreeGpu]] = {}
    for gpu in free:
        by_node.setdefault(gpu.node, []).append(gpu)
    sizes = node_sizes or {}
    any_last = any(gpu.last for gpu in free)
    any_outside = any(gpu.in_use_outside for gpu in free)

    def fit_key(node: str, need: int) -> tuple[int, int, int, int, str]:
        n_free = len(by_node[node])
        untouched = 1 if n_free >= sizes.get(node, n_free) else 0
        split_taken = max(0, need - sum(1 for g in by_node[node] if not g.last)) if any_last else 0
        clean = sum(1 for g in by_node[node] if not g.last and not g.in_use_outside) if any_outside else 0
        outside_taken = max(0, need - clean) if any_outside else 0
        return (split_taken, outside_taken, n_free - need, untouched, node)

    single = [node for node, gpus in by_node.items() if len(gpus) >= count]
    if single:
        node = min(single, key=lambda n: fit_key(n, count))
        return _pick_in_node(by_node[node], count)
    if not allow_multi_node or sum(len(g) for g in by_node.values()) < count:
        return None
    chosen: list[int] = []
    left = count
    unused = set(by_node)
    while left > 0:
        fits = [node for node in unused if len(by_node[node]) >= left]
        if fits:
            node = min(fits, key=lambda n: fit_key(n, left))
            chosen.extend(_pick_in_node(by_node[node], left))
            break
        node = min(unused, key=lambda n: (-len(by_node[n]), n))
        unused.remove(node)
        chosen.extend(_pick_in_node(by_node[node], len(by_node[node])))
        left -= len(by_node[node])
    return chosen


# --- Parts of GPUs: MIG instances and shares --------------------------------------------------------------------


@dataclass(frozen=True)
class FreeUnit:
    """A MIG instance or a GPU share free for the whole window, with its physical GPU (`parent`)."""

    id: int
    parent: int
    node: str
    index: int
    # Something outside the portal uses its memory now (a MIG instance's own reading; a share, its GPU's reading
    # while none of its shares is held): taken only where nothing else fits as well.
    in_use_outside: bool = False


def place_share(free: Sequence[FreeUnit], need: int, unit_totals: Mapping[int, int]) -> list[int] | None:
    """Ids of `need` shares of one GPU, or None. `unit_totals`: shares per GPU in total (free or not).

    Best fit, as "Beware of Fragmentation" (ATC'23) argues: a GPU already partly held before an untouched one (an
    untouched GPU stays whole for whole-GPU work), then one nothing outside the portal uses, then the one left with the
    fewest free shares (the remainders stay big enough to use), then by node and index so ties break the same way
    every time."""
    if need <= 0:
        return None
    by_parent: dict[int, list[FreeUnit]] = {}
    for unit in free:
        by_parent.setdefault(unit.parent, []).append(unit)
    fitting = [p for p, units in by_parent.items() if len(units) >= need]
    if not fitting:
        return None

    def key(parent: int) -> tuple[int, int, int, str, int]:
        n_free = len(by_parent[parent])
        untouched = 1 if n_free >= unit_totals.get(parent, n_free) else 0
        outside = int(any(u.in_use_outside for u in by_parent[parent]))
        return (untouched, outside, n_free - need, by_parent[parent][0].node, parent)

    best = min(fitting, key=key)
    return [u.id for u in sorted(by_parent[best], key=lambda u: u.index)[:need]]


def place_instances(free: Sequence[FreeUnit], count: int) -> list[int] | None:
    """Ids of `count` free MIG instances (of the profile asked), or None: from as few GPUs as possible, each time
    the GPU left with the fewest free instances (best fit, so GPUs with many free instances keep them together),
    before that the GPU where the fewest of those taken are in use outside the portal, and within a GPU the
    instances nothing outside the portal uses first."""
    if count <= 0 or len(free) < count:
        return None
    by_parent: dict[int, list[FreeUnit]] = {}
    for unit in free:
        by_parent.setdefault(unit.parent, []).append(unit)

    def outside_taken(parent: int, take: int) -> int:
        return max(0, take - sum(1 for u in by_parent[parent] if not u.in_use_outside))

    chosen: list[int] = []
    left = count
    while left > 0:
        fits = [p for p, units in by_parent.items() if len(units) >= left]
        if fits:
            need = left
            parent = min(
                fits, key=lambda p: (outside_taken(p, need), len(by_parent[p]) - need, by_parent[p][0].node, p)
            )
            take = left
        else:
            parent = min(by_parent, key=lambda p: (-len(by_parent[p]), by_parent[p][0].node, p))
            take = len(by_parent[parent])
        units = sorted(by_parent.pop(parent), key=lambda u: (u.in_use_outside, u.index))[:take]
        chosen.extend(u.id for u in sorted(units, key=lambda u: u.index))
        left -= take
    return chosen


SHARE_TOLERANCE = Decimal("0.001")


def shares_needed(share: Decimal, split: int) -> int | None:
    """How many of a GPU's `split` shares make `share` of it (0.25 of a GPU in 4: 1), or None when it is not a
    whole number of them (0.3 of a GPU in 4)."""
    need = share * split
    whole = need.to_integral_value()
    if whole < 1 or abs(need - whole) > SHARE_TOLERANCE * split:
        return None
    return int(whole)
