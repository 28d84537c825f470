"""The idle decision, as plain functions of plain data (no database): tested alone, and replayed by
bench/idle_replay.py over a real trace.

A minute of one GPU is one of:
- `busy`: utilization at or above the policy's threshold;
- `empty`: below it, with memory below `memory_below_pct` of the GPU's (nothing loaded: nothing to lose);
- `loaded`: below it, with memory held (a model loaded, a notebook paused): idle, but a reclaim would throw away
  state that may take long to rebuild, so the allocation gets LOADED_FACTOR times the minutes before the warning
  and the reclaim. It is never exempt: a loaded GPU at 0% for hours still blocks others;
- `unknown`: no telemetry for that minute. Unknown is never idle: it ends a streak, so missing data can delay a
  reclaim but never cause one.

An allocation (all its GPUs) is idle in a minute when every GPU is empty or loaded; its streak is the run of
idle minutes up to the newest one. The streak is loaded when any of its minutes had a loaded GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

LOADED_FACTOR = 2


class MinuteKind(StrEnum):
    BUSY = "busy"
    EMPTY = "empty"
    LOADED = "loaded"
    UNKNOWN = "unknown"


class Action(StrEnum):
    NONE = "none"
    WARN = "warn"
    RECLAIM = "reclaim"
    CLEAR = "clear"


@dataclass(frozen=True)
class Thresholds:
    """The parts of a team's idle policy the decision needs (minutes and percentages)."""

    warn_after_min: int = 30
    reclaim_after_min: int = 30
    utilization_below_pct: int = 5
    memory_below_pct: int = 10
    unused_release_after_min: int = 30


@dataclass(frozen=True)
class Sample:
    """One GPU over one minute: mean utilization (%), peak memory used and the GPU's memory (MiB)."""

    util: float | None
    mem_used: float | None
    mem_total: float


@dataclass(frozen=True)
class Verdict:
    action: Action
    idle_minutes: int
    loaded: bool
    warn_after: int
    reclaim_after: int
    why: str


def minute_kind(sample: Sample | None, th: Thresholds) -> MinuteKind:
    if sample is None or sample.util is None:
        return MinuteKind.UNKNOWN
    if sample.util >= th.utilization_below_pct:
        return MinuteKind.BUSY
    if sample.mem_used is None:
        return MinuteKind.UNKNOWN
    if sample.mem_total > 0 and sample.mem_used * 100 >= th.memory_below_pct * sample.mem_total:
        return MinuteKind.LOADED
    return MinuteKind.EMPTY


def combine(kinds: Sequence[MinuteKind]) -> MinuteKind:
    """One minute of an allocation from its GPUs' minutes: busy if any is busy, unknown if any is unknown (and
    none busy), loaded if any is loaded, else empty."""
    if not kinds:
        return MinuteKind.UNKNOWN
    if MinuteKind.BUSY in kinds:
        return MinuteKind.BUSY
    if MinuteKind.UNKNOWN in kinds:
        return MinuteKind.UNKNOWN
    if MinuteKind.LOADED in kinds:
        return MinuteKind.LOADED
    return MinuteKind.EMPTY


def trailing_streak(minutes: Sequence[MinuteKind]) -> tuple[int, bool]:
    """(length, loaded) of the run of idle minutes that ends with the newest minute (oldest first in)."""
    length = 0
    loaded = False
    for kind in reversed(minutes):
        if kind not in (MinuteKind.EMPTY, MinuteKind.LOADED):
            break
        length += 1
        loaded = loaded or kind == MinuteKind.LOADED
    return length, loaded


def limits(th: Thresholds, *, loaded: bool, extra_min: int = 0) -> tuple[int, int]:
    """(minutes idle before the warning, minutes idle before the reclaim). The grace between the two is always at
    least `reclaim_after_min`, so a holder has that long to react to a warning."""
    factor = LOADED_FACTOR if loaded else 1
    warn = th.warn_after_min * factor + extra_min
    return warn, warn + th.reclaim_after_min * factor


def decide(
    minutes: Sequence[MinuteKind], th: Thresholds, *, warned_for: int | None, extra_min: int | None = 0
) -> Verdict:
    """What to do with an allocation given its minutes since it started (oldest first, the newest last).

    `warned_for`: minutes since the holder was warned about this streak (None: not warned). `extra_min`: an
    interactive exemption's extra minutes; None means exempt (never warned, never reclaimed)."""
    warned = warned_for is not None
    streak, loaded = trailing_streak(minutes)
    warn_after, reclaim_after = limits(th, loaded=loaded, extra_min=extra_min or 0)

    def verdict(action: Action, why: str) -> Verdict:
        return Verdict(action, streak, loaded, warn_after, reclaim_after, why)

    if extra_min is None:
        return verdict(Action.NONE, "exempt")
    if warned_for is not None and streak >= reclaim_after and warned_for >= reclaim_after - warn_after:
        return verdict(Action.RECLAIM, f"idle {streak} min (limit {reclaim_after})")
    if streak >= warn_after and not warned:
        # A reclaim always follows a warning, even when the first scan already sees a long streak.
        return verdict(Action.WARN, f"idle {streak} min (warning at {warn_after})")
    if warned and streak == 0 and minutes and minutes[-1] == MinuteKind.BUSY:
        return verdict(Action.CLEAR, "busy again")
    return verdict(Action.NONE, f"idle {streak} min")


def unused(minutes: Sequence[MinuteKind], th: Thresholds) -> bool:
    """A reservation whose GPUs were never used (busy or loaded) in its first `unused_release_after_min` minutes,
    with telemetry for most of them (no data is no evidence)."""
    window = list(minutes[: th.unused_release_after_min])
    if th.unused_release_after_min <= 0 or len(window) < th.unused_release_after_min:
        return False
    if any(k in (MinuteKind.BUSY, MinuteKind.LOADED) for k in window):
        return False
    known = sum(1 for k in window if k == MinuteKind.EMPTY)
    return known * 2 > len(window)
