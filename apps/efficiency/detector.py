"""The idle decision, as plain functions of plain data (no database): tested alone, and replayed by
bench/idle_replay.py over a real trace.

A minute of one GPU is one of:
- `busy`: utilization at or above the policy's threshold;
- `empty`: below it, with memory below `memory_below_pct` of the GPU's (nothing loaded: nothing to lose);
- `loaded`: below it, with memory held (a model loaded, a notebook paused);
- `held`: a MIG instance holding memory (a process on it), its utilization unknown (see below);
- `unknown`: no telemetry for that minute.
An allocation's minute (all its GPUs) has the highest utilization of its GPUs and is busy if any GPU is busy,
held if any is held, unknown if any is unknown, loaded if any is loaded, else empty.

Idle is judged over a sliding window, not minute by minute, because real work is bursty: an inference server
answering a request every twenty minutes shows one busy minute among idle ones, and a job waiting on its input
shows the same. The holder is warned when the mean utilization over the last `warn_after_min` minutes (with
telemetry for at least COVERAGE of them) is below the threshold and the newest minute is idle. Then the grace:
any busy minute after the warning clears it (the holder came back); `reclaim_after_min` minutes of nothing but
idle minutes after the warning, and the allocation is reclaimed.

A GPU holding memory at low utilization is idle, but a reclaim would throw away state that may take long to
rebuild (a model loaded, a debugger paused), so its window is LOADED_FACTOR times as long before the warning; the
grace after the warning is the same. It is never exempt: a loaded GPU at 0% for hours still blocks others.
Unknown minutes count for nothing: too few known minutes in the window, no warning; missing data can delay a
reclaim but never cause one.

Parts of a GPU. A reservation of a share is judged by its GPU's minutes (`Sample` of the whole GPU): the holders
of one GPU's shares run on the same SMs and the GPU's utilization does not say whose work keeps it busy, so a
share is idle only while the whole GPU is, and loaded while anything holds memory on it; except where the node
tells what no job's processes do there and the GPU's other holders' uids are known, so their work can be taken out
(selectors `with_share_reservations_own_minutes`). A job on a share is
judged by its own processes' minutes where its node reads per-process utilization (selectors
`with_share_jobs_own_minutes`), against its shares' memory. A MIG instance has no utilization reading from NVML's
usual call (NOT_SUPPORTED per instance). On Hopper and later the agent reads its SM activity through GPM instead,
and such a minute is judged as a GPU's, against the instance's memory. Elsewhere it has only its memory:
`instance_sample` makes a minute in which it held
less than NO_PROCESS_MIB an empty one at 0%, since no process can run a kernel without a CUDA context, which
takes far more; a minute with more is `held`: used, but idle or busy cannot be told. A held minute counts for
nothing in the window's mean (like an unknown one), makes the reservation used (never released as unused) and,
after a warning, clears it (the holder came back). So an unused or emptied instance is released and reclaimed
like a GPU, and one with a process on it is never judged, whatever the process does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

LOADED_FACTOR = 2
COVERAGE = 0.8  # share of a window's minutes that must have telemetry before it is judged
# An instance with no process: NVML shows about a dozen MiB used on an empty MIG instance, while one CUDA context
# alone holds a few hundred MiB (more with the libraries a framework loads).
NO_PROCESS_MIB = 64


class MinuteKind(StrEnum):
    BUSY = "busy"
    EMPTY = "empty"
    LOADED = "loaded"
    HELD = "held"
    UNKNOWN = "unknown"


class Action(StrEnum):
    NONE = "none"
    WARN = "warn"
    RECLAIM = "reclaim"
    CLEAR = "clear"


@dataclass(frozen=True)
class Thresholds:
    """The parts of a team's idle policy the decision needs (minutes and percentages)."""

    warn_after_min: int = 60
    reclaim_after_min: int = 15
    utilization_below_pct: int = 5
    memory_below_pct: int = 10
    unused_release_after_min: int = 30


@dataclass(frozen=True)
class Sample:
    """One GPU over one minute: mean utilization (%), peak memory used and the GPU's memory (MiB). `held`: no
    utilization, but memory held by a process (a MIG instance's minute, `instance_sample`)."""

    util: float | None
    mem_used: float | None
    mem_total: float
    held: bool = False


@dataclass(frozen=True)
class Minute:
    """One minute of an allocation: its highest GPU utilization (None: unknown) and its kind."""

    util: float | None
    kind: MinuteKind


@dataclass(frozen=True)
class Verdict:
    action: Action
    window_mean: float | None
    loaded: bool
    window_min: int
    grace_min: int
    why: str


def instance_sample(mem_used: float | None, mem_total: float, util: float | None = None) -> Sample:
    """A MIG instance's minute: from its SM activity (GPM) where the agent read it, else from its memory peak alone
    (the module's docstring says why)."""
    if util is not None:
        return Sample(util=util, mem_used=mem_used, mem_total=mem_total)
    if mem_used is None:
        return Sample(util=None, mem_used=None, mem_total=mem_total)
    if mem_used < NO_PROCESS_MIB:
        return Sample(util=0.0, mem_used=mem_used, mem_total=mem_total)
    return Sample(util=None, mem_used=mem_used, mem_total=mem_total, held=True)


def minute_kind(sample: Sample | None, th: Thresholds) -> MinuteKind:
    if sample is None or sample.util is None:
        return MinuteKind.HELD if sample is not None and sample.held else MinuteKind.UNKNOWN
    if sample.util >= th.utilization_below_pct:
        return MinuteKind.BUSY
    if sample.mem_used is None:
        return MinuteKind.UNKNOWN
    if sample.mem_total > 0 and sample.mem_used * 100 >= th.memory_below_pct * sample.mem_total:
        return MinuteKind.LOADED
    return MinuteKind.EMPTY


def combine(samples: Sequence[Sample | None], th: Thresholds) -> Minute:
    """One minute of an allocation from its GPUs' samples."""
    kinds = [minute_kind(s, th) for s in samples]
    if not kinds:
        return Minute(None, MinuteKind.UNKNOWN)
    utils = [s.util for s in samples if s is not None and s.util is not None]
    top = max(utils) if utils else None
    if MinuteKind.BUSY in kinds:
        return Minute(top, MinuteKind.BUSY)
    if MinuteKind.HELD in kinds:
        return Minute(None, MinuteKind.HELD)
    if MinuteKind.UNKNOWN in kinds:
        return Minute(None, MinuteKind.UNKNOWN)
    if MinuteKind.LOADED in kinds:
        return Minute(top, MinuteKind.LOADED)
    return Minute(top, MinuteKind.EMPTY)


def window_of(th: Thresholds, *, loaded: bool, extra_min: int = 0) -> int:
    """Minutes of low mean utilization before the warning."""
    return th.warn_after_min * (LOADED_FACTOR if loaded else 1) + extra_min


def _known_mean(window: Sequence[Minute]) -> tuple[float | None, int]:
    utils = [m.util for m in window if m.util is not None and m.kind not in (MinuteKind.UNKNOWN, MinuteKind.HELD)]
    return (sum(utils) / len(utils) if utils else None), len(utils)


def decide(minutes: Sequence[Minute], th: Thresholds, *, warned_for: int | None, extra_min: int | None = 0) -> Verdict:
    """What to do with an allocation given its minutes since it started (oldest first, the newest last).

    `warned_for`: minutes since the holder was warned (None: not warned); the last `warned_for` minutes are the
    grace. `extra_min`: an interactive exemption's extra minutes; None means exempt (never warned or reclaimed)."""
    newest = minutes[-1] if minutes else Minute(None, MinuteKind.UNKNOWN)
    loaded = newest.kind == MinuteKind.LOADED
    window = window_of(th, loaded=loaded, extra_min=extra_min or 0)
    mean, known = _known_mean(minutes[-window:]) if len(minutes) >= window else (None, 0)

    def verdict(action: Action, why: str) -> Verdict:
        return Verdict(action, mean, loaded, window, th.reclaim_after_min, why)

    if extra_min is None:
        return verdict(Action.NONE, "exempt")
    if warned_for is not None:
        grace = minutes[len(minutes) - warned_for :] if warned_for > 0 else []
        if any(m.kind == MinuteKind.BUSY for m in grace):
            return verdict(Action.CLEAR, "busy again after the warning")
        if any(m.kind == MinuteKind.HELD for m in grace):
            return verdict(Action.CLEAR, "a process on the MIG instance again after the warning")
        _, grace_known = _known_mean(grace)
        if warned_for >= th.reclaim_after_min and grace_known >= COVERAGE * th.reclaim_after_min:
            return verdict(Action.RECLAIM, f"no busy minute in the {warned_for} min since the warning")
        return verdict(Action.NONE, "warned, in the grace")
    if (
        mean is None
        or known < COVERAGE * window
        or newest.kind in (MinuteKind.BUSY, MinuteKind.HELD, MinuteKind.UNKNOWN)
    ):
        return verdict(Action.NONE, "not enough idle history")
    if mean < th.utilization_below_pct:
        return verdict(Action.WARN, f"mean utilization {mean:.1f}% over {window} min")
    return verdict(Action.NONE, f"mean utilization {mean:.1f}%")


def unused(minutes: Sequence[Minute], th: Thresholds) -> bool:
    """A reservation whose GPUs were never used (busy, loaded or held) in its first `unused_release_after_min`
    minutes, with telemetry for most of them (no data is no evidence)."""
    window = list(minutes[: th.unused_release_after_min])
    if th.unused_release_after_min <= 0 or len(window) < th.unused_release_after_min:
        return False
    if any(m.kind in (MinuteKind.BUSY, MinuteKind.LOADED, MinuteKind.HELD) for m in window):
        return False
    known = sum(1 for m in window if m.kind == MinuteKind.EMPTY)
    return known >= COVERAGE * len(window)
