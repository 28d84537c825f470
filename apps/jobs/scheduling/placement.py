"""Gang best-fit placement over an index of free GPUs that one scheduling pass builds and updates.

Why an index: a pass over thousands of GPUs and ten thousand queued jobs has to take thousands of
placement decisions a second, so a job must not scan every node. A node whose free GPUs are all of one
model and carry no deadline (a "simple" node, nearly all of them) sits in a bucket keyed by (model, free
count); a job that needs k GPUs looks at buckets k, k+1, ... of each acceptable model and takes the first
node it finds. That is best fit: the node left with the fewest free GPUs after placement, so whole 8-GPU
nodes stay whole for the jobs that need them. The few "complex" nodes (mixed models, or free GPUs that must
be handed back before a reservation or the backfill head starts) are scanned per job.

Why the whole gang on one node: the GPUs of a multi-GPU job talk over NVLink/PCIe; spread over nodes they
would crawl, so a job gets all its GPUs on one node or waits.

Time rules, applied to every job that is not bound to a reservation: a GPU inside an active reservation is
not for it; a GPU whose reservation (portal booking or backfill shadow) starts later is usable only when
``now + max_duration_s <= start``. The ``free_at``/``earliest_start`` half answers "when could this gang
start at the earliest?" from running jobs' expected ends, which backfill needs for the shadow reservation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from apps.jobs.scheduling.model import INF, Gpu, Reservation, Snapshot

EPS = 1e-9
"""Slack for float comparisons of capacities and times."""

_NOWHERE = 0
_COMPLEX = -1


def _gpu_sort_key(gpu: Gpu) -> tuple[str, bool, bool, str]:
    # A split GPU last on its node: a job takes the node's first free GPUs, so it takes one only when it needs it.
    # Before those, one whose memory something outside the portal uses: a job placed there would share it.
    return (gpu.node, gpu.split, gpu.in_use_outside, gpu.id)


class ClusterState:
    """The free GPUs of one pass, indexed for placement; mutated as the pass starts jobs.

    GPUs are numbered 0..n-1 in (node, split, id) order and nodes 0..m-1 in name order, so every tie breaks the
    same way whatever order the shell loaded the rows in.
    """

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.now = now
        gpus = sorted(snapshot.gpus, key=_gpu_sort_key)
        self.gpu_ids: list[str] = [g.id for g in gpus]
        self.index_of: dict[str, int] = {gid: i for i, gid in enumerate(self.gpu_ids)}
        if len(self.index_of) != len(gpus):
            raise ValueError("duplicate GPU id in snapshot")
        self.gpu_model: list[str] = [g.model for g in gpus]
        self.gpu_split: list[bool] = [g.split for g in gpus]
        self.gpu_node: list[int] = []
        self.node_names: list[str] = []
        self.node_gpus: list[list[int]] = []
        node_index: dict[str, int] = {}
        for i, g in enumerate(gpus):
            n = node_index.get(g.node)
            if n is None:
                n = len(self.node_names)
                node_index[g.node] = n
                self.node_names.append(g.node)
                self.node_gpus.append([])
            self.gpu_node.append(n)
            self.node_gpus[n].append(i)
        n_nodes = len(self.node_names)
        # A node with a GPU split in shares is placed on as a complex node, so that a job takes such a GPU only
        # where no node gives it exclusive GPUs (find's key); none in the trace replay, few in a fleet.
        self.node_split: list[bool] = [any(self.gpu_split[i] for i in members) for members in self.node_gpus]
        self.node_model: list[str | None] = []
        for members in self.node_gpus:
            models = {self.gpu_model[i] for i in members}
            self.node_model.append(models.pop() if len(models) == 1 else None)

        # When each GPU is free for a new job, ignoring reservations: now, a running job's expected end, or
        # never (a GPU partly used by something the snapshot does not explain).
        running_end: dict[int, float] = {}
        for job in snapshot.running:
            end = max(job.expected_end, now)
            for gid in job.gpu_ids:
                idx = self.index_of.get(gid)
                if idx is not None and running_end.get(idx, -INF) < end:
                    running_end[idx] = end
        self.free_at: list[float] = []
        busy: list[bool] = []
        for i, g in enumerate(gpus):
            held_until = running_end.get(i)
            whole = g.free >= 1.0 - EPS and g.capacity >= 1.0 - EPS
            busy.append(held_until is not None or not whole)
            self.free_at.append(held_until if held_until is not None else (now if whole else INF))

        # Portal reservations per GPU: intervals that still matter, the active ones, and for each GPU the
        # earliest future start (a job that is not bound to it must be done by then).
        self.reservations: dict[str, Reservation] = {}
        self.gpu_resv: dict[int, list[tuple[float, float]]] = {}
        self.until_portal: list[float] = [INF] * len(gpus)
        self.resv_gpus: dict[str, list[int]] = {}
        active_gpu: dict[int, str] = {}
        for r in sorted(snapshot.reservations, key=lambda r: (r.start, r.id)):
            if r.end <= now + EPS:
                continue
            self.reservations[r.id] = r
            members = sorted(self.index_of[g] for g in r.gpu_ids if g in self.index_of)
            self.resv_gpus[r.id] = members
            for i in members:
                self.gpu_resv.setdefault(i, []).append((r.start, r.end))
                if r.start <= now:
                    active_gpu[i] = r.id
                elif r.start < self.until_portal[i]:
                    self.until_portal[i] = r.start
        self.until: list[float] = list(self.until_portal)

        # Free GPUs per node: plain (no deadline), constrained (must be back by until[i]), and free GPUs
        # inside an active reservation (only for jobs bound to it).
        self.node_free: list[list[int]] = [[] for _ in range(n_nodes)]
        self.node_cfree: list[list[int]] = [[] for _ in range(n_nodes)]
        self.resv_free: dict[str, list[int]] = {rid: [] for rid in self.resv_gpus}
        for i in range(len(gpus)):
            if busy[i]:
                continue
            rid = active_gpu.get(i)
            if rid is not None:
                self.resv_free[rid].append(i)
            elif self.until[i] == INF:
                self.node_free[self.gpu_node[i]].append(i)
            else:
                self.node_cfree[self.gpu_node[i]].append(i)

        max_size = max((len(m) for m in self.node_gpus), default=0)
        self.buckets: dict[str, list[dict[int, None]]] = {}
        for m in sorted(set(self.gpu_model)):
            self.buckets[m] = [{} for _ in range(max_size + 1)]
        self.complex: dict[int, None] = {}
        self.node_where: list[int] = [_NOWHERE] * n_nodes
        for n in range(n_nodes):
            self._index(n)

        self._models_cache: dict[frozenset[str] | None, tuple[str, ...]] = {}
        self._capacity_cache: dict[frozenset[str] | None, int] = {}
        self.shadow_gpus: set[int] = set()
        self._relaxed_failed: dict[tuple[int, frozenset[str] | None, bool], float] = {}
        self._reserved_free: set[int] | None = None
        self._reserved_nodes: set[int] = set()

    # -- index upkeep ---------------------------------------------------------------------------------------

    def _index(self, n: int) -> None:
        free = self.node_free[n]
        cfree = self.node_cfree[n]
        if not free and not cfree:
            self.node_where[n] = _NOWHERE
            return
        model = self.node_model[n]
        if model is not None and not cfree and not self.node_split[n]:
            self.buckets[model][len(free)][n] = None
            self.node_where[n] = len(free)
        else:
            self.complex[n] = None
            self.node_where[n] = _COMPLEX

    def _unindex(self, n: int) -> None:
        where = self.node_where[n]
        if where > 0:
            model = self.node_model[n]
            assert model is not None
            del self.buckets[model][where][n]
        elif where == _COMPLEX:
            del self.complex[n]
        self.node_where[n] = _NOWHERE

    def models_for(self, models: frozenset[str] | None) -> tuple[str, ...]:
        """The fleet's models a job accepts, in a fixed order."""
        cached = self._models_cache.get(models)
        if cached is None:
            cached = tuple(m for m in self.buckets if models is None or m in models)
            self._models_cache[models] = cached
        return cached

    def largest_gang(self, models: frozenset[str] | None) -> int:
        """The most acceptable GPUs on any one node, busy or not: a bigger gang can never run here."""
        cached = self._capacity_cache.get(models)
        if cached is None:
            cached = 0
            for members in self.node_gpus:
                count = sum(1 for i in members if models is None or self.gpu_model[i] in models)
                cached = max(cached, count)
            self._capacity_cache[models] = cached
        return cached

    # -- placement now --------------------------------------------------------------------------------------

    def _usable_on(self, n: int, models: frozenset[str] | None, end: float) -> list[int]:
        """GPUs of complex node n a job ending at ``end`` may take, deadline-bound ones first."""
        model_of = self.gpu_model
        until = self.until
        bound = sorted(
            (i for i in self.node_cfree[n] if (models is None or model_of[i] in models) and until[i] >= end - EPS),
            key=lambda i: (until[i], i),
        )
        bound.extend(i for i in self.node_free[n] if models is None or model_of[i] in models)
        if self.node_split[n]:  # split GPUs last: taken only when the node's others are not enough
            split = self.gpu_split
            bound = [i for i in bound if not split[i]] + [i for i in bound if split[i]]
        return bound

    def find(
        self, gpu_count: int, models: frozenset[str] | None, duration: float, nodes: Set[int] | None = None
    ) -> tuple[int, list[int]] | None:
        """Best-fit node and GPUs for a gang that would run [now, now + duration), or None.

        ``nodes`` narrows the choice to those nodes (``longwork``: long work goes where long work is)."""
        # (GPUs split in shares taken, free GPUs left on the node, node): exclusive GPUs anywhere before a split
        # one, then best fit.
        best_key: tuple[int, int, int] | None = None
        best_node = -1
        for model in self.models_for(models):
            buckets = self.buckets[model]
            for count in range(gpu_count, len(buckets)):
                bucket = buckets[count]
                if bucket:
                    if nodes is None:
                        n = next(iter(bucket))
                    else:
                        found = next((m for m in bucket if m in nodes), None)
                        if found is None:
                            continue
                        n = found
                    if best_key is None or (0, count, n) < best_key:
                        best_key = (0, count, n)
                        best_node = n
                    break
        best_gpus: list[int] | None = None
        if self.complex:
            end = self.now + duration
            for n in self.complex:
                if nodes is not None and n not in nodes:
                    continue
                usable = self._usable_on(n, models, end)
                if len(usable) >= gpu_count:
                    splits = sum(1 for i in usable[:gpu_count] if self.gpu_split[i]) if self.node_split[n] else 0
                    key = (splits, len(self.node_free[n]) + len(self.node_cfree[n]), n)
                    if best_key is None or key < best_key:
                        best_key = key
                        best_node = n
                        best_gpus = usable[:gpu_count]
        if best_key is None:
            return None
        if best_gpus is None:
            best_gpus = self.node_free[best_node][:gpu_count]
        return best_node, best_gpus

    def take(self, n: int, gpus: Sequence[int], end: float) -> None:
        """Allocate ``gpus`` of node n to a job that runs until ``end``."""
        self._unindex(n)
        free = self.node_free[n]
        cfree = self.node_cfree[n]
        if len(gpus) <= len(free) and free[: len(gpus)] == list(gpus):
            del free[: len(gpus)]
        else:
            for i in gpus:
                if i in free:
                    free.remove(i)
                else:
                    cfree.remove(i)
        for i in gpus:
            self.free_at[i] = end
        self._index(n)

    def hold_for(self, gpus: Iterable[int], start: float) -> None:
        """Put a backfill shadow on ``gpus`` from ``start``: jobs started now must give them back by then."""
        for i in gpus:
            self.shadow_gpus.add(i)
            if start >= self.until[i]:
                continue
            n = self.gpu_node[i]
            self._unindex(n)
            if self.until[i] == INF and i in self.node_free[n]:
                self.node_free[n].remove(i)
                self.node_cfree[n].append(i)
            self.until[i] = start
            self._index(n)

    def fits_relaxed(self, gpu_count: int, models: frozenset[str] | None, duration: float, *, portal: bool) -> bool:
        """Would the gang fit now if the backfill shadow (and with ``portal`` the bookings) did not exist?

        Only used to explain a wait, so it may scan. Simple nodes cannot change the answer: they have no
        deadlines and already failed to fit. Like placement, the answer only turns from yes to no as the
        pass goes on, so a "no" is remembered for the shape and every longer duration.
        """
        memo_key = (gpu_count, models, portal)
        if duration >= self._relaxed_failed.get(memo_key, INF):
            return False
        end = self.now + duration
        if self._reserved_free is None:
            self._reserved_free = {i for free in self.resv_free.values() for i in free}
            self._reserved_nodes = {self.gpu_node[i] for i in self._reserved_free}
        rfree = self._reserved_free if portal else set()
        nodes = set(self.complex)
        if portal:
            nodes.update(self._reserved_nodes)
        for n in sorted(nodes):
            count = 0
            free, cfree = self.node_free[n], self.node_cfree[n]
            for i in self.node_gpus[n]:
                if models is not None and self.gpu_model[i] not in models:
                    continue
                usable = i in free or i in rfree
                if not usable and i in cfree:
                    usable = portal or self.until_portal[i] >= end - EPS
                count += usable
            if count >= gpu_count:
                return True
        self._relaxed_failed[memo_key] = duration
        return False

    # -- placement inside a reservation ---------------------------------------------------------------------

    def find_in_reservation(
        self, reservation_id: str, gpu_count: int, models: frozenset[str] | None
    ) -> tuple[int, list[int]] | None:
        """Best-fit node and GPUs among the reservation's free GPUs, or None."""
        per_node: dict[int, list[int]] = {}
        for i in self.resv_free.get(reservation_id, ()):
            if models is None or self.gpu_model[i] in models:
                per_node.setdefault(self.gpu_node[i], []).append(i)
        best: tuple[int, int] | None = None
        for n, free in per_node.items():
            if len(free) >= gpu_count and (best is None or (len(free), n) < best):
                best = (len(free), n)
        if best is None:
            return None
        return best[1], per_node[best[1]][:gpu_count]

    def reservation_capacity(self, reservation_id: str, models: frozenset[str] | None) -> int:
        """The most acceptable GPUs of the reservation on one node, busy or not."""
        per_node: dict[int, int] = {}
        for i in self.resv_gpus.get(reservation_id, ()):
            if models is None or self.gpu_model[i] in models:
                per_node[self.gpu_node[i]] = per_node.get(self.gpu_node[i], 0) + 1
        return max(per_node.values(), default=0)

    def take_reserved(self, reservation_id: str, gpus: Sequence[int], end: float) -> None:
        """Allocate reservation GPUs to a job bound to it."""
        free = self.resv_free[reservation_id]
        self._reserved_free = None
        for i in gpus:
            free.remove(i)
            self.free_at[i] = end

    # -- earliest start (backfill shadow) -------------------------------------------------------------------

    def earliest_start(
        self, gpu_count: int, models: frozenset[str] | None, duration: float, nodes: Set[int] | None = None
    ) -> tuple[float, int, list[int]] | None:
        """The earliest time, node and GPUs at which the gang could start, from expected ends; None = never.

        Running jobs are taken to run their full ``max_duration_s``: an upper bound, so the planned start is
        a promise that can only come early. Portal reservations are respected over [t, t + duration).
        Among the GPUs free by then it picks those that free up last, leaving the ones free now to backfill.
        """
        now = self.now
        free_at = self.free_at
        best_key: tuple[float, int, int] | None = None
        best_gpus: list[int] = []
        for n, members in enumerate(self.node_gpus):
            if nodes is not None and n not in nodes:
                continue
            acc = [i for i in members if models is None or self.gpu_model[i] in models]
            if len(acc) < gpu_count:
                continue
            intervals = [self.gpu_resv.get(i) for i in acc]
            if not any(intervals):
                times = sorted(free_at[i] for i in acc)
                t = max(times[gpu_count - 1], now)
                if t == INF:
                    continue
                usable = [i for i in acc if free_at[i] <= t]
            else:
                candidates = {now}
                candidates.update(free_at[i] for i in acc if now <= free_at[i] < INF)
                for iv in intervals:
                    if iv:
                        candidates.update(e for _, e in iv if e > now)
                found: list[int] | None = None
                for t in sorted(candidates):
                    usable = [
                        i
                        for i, iv in zip(acc, intervals, strict=True)
                        if free_at[i] <= t and not (iv and any(s < t + duration and e > t for s, e in iv))
                    ]
                    if len(usable) >= gpu_count:
                        found = usable
                        break
                if found is None:
                    continue
                usable = found
            key = (t, len(usable), n)
            if best_key is None or key < best_key:
                best_key = key
                usable.sort(key=lambda i: (-free_at[i], i))
                best_gpus = usable[:gpu_count]
        if best_key is None:
            return None
        return best_key[0], best_key[2], sorted(best_gpus)


MILLI = 1000
"""Fractions of a GPU are counted in thousandths (the trace's ``gpu_milli``), so sums stay exact."""


class ShareState:
    """The partly used GPUs of one pass and their free thousandths, for jobs that ask for a fraction of one GPU.

    ``place_fraction`` is the portal's placement of such a job, by best fit as "Beware of Fragmentation"
    (USENIX ATC 2023) argues, in this order: a GPU that is already shared, if one has room, so whole GPUs stay
    whole for gangs; among those the one it fills most tightly (least left over), so the remainders stay big
    enough to use, then the node with the fewest whole GPUs free; only when none has room, a whole GPU opened by
    the gang best fit (``ClusterState.find`` with one GPU: the node left with the fewest free GPUs), so nodes
    with many whole GPUs stay whole. Gangs never share: they take whole GPUs through ``ClusterState``.
    """

    def __init__(self, snapshot: Snapshot, state: ClusterState) -> None:
        self.state = state
        self.free: dict[int, int] = {}
        for g in snapshot.gpus:
            i = state.index_of[g.id]
            if g.capacity >= 1.0 - EPS and EPS < g.free < 1.0 - EPS and not self._in_active_reservation(i):
                self.free[i] = round(g.free * MILLI)

    def _in_active_reservation(self, i: int) -> bool:
        now = self.state.now
        return any(start <= now < end for start, end in self.state.gpu_resv.get(i, ()))

    def place_fraction(
        self, milli: int, models: frozenset[str] | None, duration: float, nodes: Set[int] | None = None
    ) -> tuple[int, int] | None:
        """Take ``milli`` thousandths of one GPU for ``duration`` seconds: (node, GPU) by the rules above, or None
        when no GPU has room now. The state is updated (the GPU's free thousandths, or the whole GPU opened).
        ``nodes`` narrows the choice to those nodes."""
        if not 0 < milli <= MILLI:
            raise ValueError(f"a fraction is 1..{MILLI} thousandths of a GPU, not {milli}")
        state = self.state
        end = state.now + duration
        best: tuple[int, int, int] | None = None
        best_i = -1
        for i, free in self.free.items():
            if free < milli or (models is not None and state.gpu_model[i] not in models):
                continue
            if state.until[i] < end - EPS:  # a reservation starts on it before this job would end
                continue
            n = state.gpu_node[i]
            if nodes is not None and n not in nodes:
                continue
            key = (free - milli, len(state.node_free[n]) + len(state.node_cfree[n]), i)
            if best is None or key < best:
                best, best_i = key, i
        if best is not None:
            self.free[best_i] -= milli
            state.free_at[best_i] = max(state.free_at[best_i], end)
            return state.gpu_node[best_i], best_i
        spot = state.find(1, models, duration, nodes)
        if spot is None:
            return None
        n, (i,) = spot
        state.take(n, [i], end)
        if milli < MILLI:
            self.free[i] = MILLI - milli
        return n, i
