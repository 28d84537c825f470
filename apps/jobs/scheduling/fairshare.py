"""Exponentially decayed GPU usage per team, and how far each team is above or below its share.

Why decay: fair share should remember last week, not last year. A GPU-second used ``h`` seconds ago
counts half (``h`` = the half-life, configurable), so a team that ran a huge sweep a month ago is not
punished today, while a team that holds the fleet right now goes to the back of its priority level.
Usage is folded in lazily (one number and a timestamp per team), so the ORM shell can compute it from the
ledger and the trace replay can keep it up to date on every event at no cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0
"""One week: Slurm's default PriorityDecayHalfLife."""


def decay(elapsed_s: float, half_life_s: float) -> float:
    """The weight of usage that happened ``elapsed_s`` ago."""
    if elapsed_s <= 0.0:
        return 1.0
    return math.exp(-math.log(2.0) * elapsed_s / half_life_s)


def decayed_gpu_seconds(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """Decayed GPU-seconds, seen from ``now``, of ``gpus`` GPUs held over [start, min(end, now)).

    The exact integral of ``gpus * 2 ** (-(now - t) / h)`` dt, so the result does not depend on how often it
    is sampled.
    """
    end = min(end, now)
    if end <= start:
        return 0.0
    lam = math.log(2.0) / half_life_s
    return gpus * (math.exp(-lam * (now - end)) - math.exp(-lam * (now - start))) / lam


class UsageLedger:
    """Decayed GPU-seconds per team, updated as intervals of use are recorded (mutable, in-memory)."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        if half_life_s <= 0.0:
            raise ValueError("half-life must be positive")
        self.half_life_s = half_life_s
        self._value: dict[str, float] = {}
        self._as_of: dict[str, float] = {}

    def add(self, team: str, gpus: float, start: float, end: float) -> None:
        """Record ``gpus`` GPUs used by ``team`` over [start, end)."""
        self._advance(team, end)
        self._value[team] += decayed_gpu_seconds(gpus, start, end, end, self.half_life_s)

    def _advance(self, team: str, now: float) -> None:
        as_of = self._as_of.get(team)
        if as_of is None:
            self._value[team] = 0.0
            self._as_of[team] = now
        elif now > as_of:
            self._value[team] *= decay(now - as_of, self.half_life_s)
            self._as_of[team] = now

    def usage(self, team: str, now: float) -> float:
        """The team's decayed usage seen from ``now`` (not before its last recorded interval)."""
        as_of = self._as_of.get(team)
        if as_of is None:
            return 0.0
        return self._value[team] * decay(now - as_of, self.half_life_s)

    def snapshot(self, now: float, running: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
        """Usage of every known team at ``now``, plus ``running`` (team, gpus, start) accrued until now."""
        out = {team: self.usage(team, now) for team in self._value}
        for team, gpus, start in running:
            out[team] = out.get(team, 0.0) + decayed_gpu_seconds(gpus, start, now, now, self.half_life_s)
        return out


def usage_ratios(
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    teams: Iterable[str],
    *,
    default_share: float = 1.0,
) -> dict[str, float]:
    """Each team's fraction of the usage divided by its fraction of the shares (1.0 = exactly fair).

    Teams missing from ``shares`` get ``default_share``; with no usage at all every ratio is 0.
    """
    names = sorted(set(teams) | set(usage))
    share_of = {t: max(shares.get(t, default_share), 0.0) for t in names}
    total_share = sum(share_of.values()) or 1.0
    total_usage = sum(max(usage.get(t, 0.0), 0.0) for t in names)
    if total_usage <= 0.0:
        return dict.fromkeys(names, 0.0)
    out: dict[str, float] = {}
    for t in names:
        normalized_share = share_of[t] / total_share
        u = max(usage.get(t, 0.0), 0.0) / total_usage
        out[t] = u / normalized_share if normalized_share > 0.0 else math.inf
    return out


def fairshare_penalty(ratio: float) -> float:
    """Map a usage ratio to [0, 1): 0 for an idle team, 0.5 at exactly its share, toward 1 far above it.

    Bounded on purpose: the penalty delays a team's jobs by at most a fixed time, so nothing starves.
    """
    if math.isinf(ratio):
        return 1.0
    return 1.0 - math.exp(-math.log(2.0) * ratio)
