"""The idle decision alone (no database): minute kinds, the sliding window's mean, the loaded GPU's longer window,
warn-before-reclaim, a grace any busy minute clears, missing telemetry, exemptions and unused reservations."""

from __future__ import annotations

from apps.efficiency.detector import (
    LOADED_FACTOR,
    Action,
    Minute,
    MinuteKind,
    Sample,
    Thresholds,
    combine,
    decide,
    minute_kind,
    unused,
)

TH = Thresholds(warn_after_min=60, reclaim_after_min=15, utilization_below_pct=5, memory_below_pct=10)
E = Minute(0.0, MinuteKind.EMPTY)
L = Minute(1.0, MinuteKind.LOADED)
B = Minute(80.0, MinuteKind.BUSY)
U = Minute(None, MinuteKind.UNKNOWN)


def test_minute_kinds_follow_the_thresholds() -> None:
    assert minute_kind(Sample(util=4.9, mem_used=100, mem_total=80000), TH) == MinuteKind.EMPTY
    assert minute_kind(Sample(util=5, mem_used=100, mem_total=80000), TH) == MinuteKind.BUSY
    assert minute_kind(Sample(util=0, mem_used=8000, mem_total=80000), TH) == MinuteKind.LOADED
    assert minute_kind(Sample(util=0, mem_used=7999, mem_total=80000), TH) == MinuteKind.EMPTY
    assert minute_kind(Sample(util=None, mem_used=0, mem_total=80000), TH) == MinuteKind.UNKNOWN
    assert minute_kind(None, TH) == MinuteKind.UNKNOWN


def test_an_allocation_is_idle_only_when_every_gpu_is() -> None:
    empty = Sample(util=1, mem_used=0, mem_total=100)
    loaded = Sample(util=0, mem_used=50, mem_total=100)
    busy = Sample(util=90, mem_used=50, mem_total=100)
    assert combine([empty, empty], TH) == Minute(1, MinuteKind.EMPTY)
    assert combine([empty, loaded], TH) == Minute(1, MinuteKind.LOADED)
    assert combine([empty, busy], TH) == Minute(90, MinuteKind.BUSY)
    assert combine([empty, None], TH).kind == MinuteKind.UNKNOWN
    assert combine([None, busy], TH).kind == MinuteKind.BUSY


def test_warning_needs_a_full_window_of_low_mean_utilization() -> None:
    assert decide([E] * 59, TH, warned_for=None).action == Action.NONE
    v = decide([B] * 10 + [E] * 60, TH, warned_for=None)
    assert v.action == Action.WARN and v.window_mean == 0 and not v.loaded and v.window_min == 60


def test_a_burst_now_and_then_is_still_idle_but_steady_work_is_not() -> None:
    bursty = ([B] + [E] * 19) * 3  # one busy minute in twenty: mean 4%
    assert decide([*bursty, E], TH, warned_for=None).action == Action.WARN
    steady = ([B] + [E] * 9) * 6 + [E]  # one in ten: mean 8%
    assert decide(steady, TH, warned_for=None).action == Action.NONE
    assert decide([E] * 60 + [B], TH, warned_for=None).action == Action.NONE  # busy right now


def test_reclaim_after_a_grace_of_idle_minutes_and_never_on_the_first_sight() -> None:
    assert decide([E] * 500, TH, warned_for=None).action == Action.WARN
    assert decide([E] * 500, TH, warned_for=14).action == Action.NONE
    v = decide([E] * 500, TH, warned_for=15)
    assert v.action == Action.RECLAIM and v.grace_min == 15


def test_a_busy_minute_in_the_grace_clears_the_warning() -> None:
    assert decide([E] * 70 + [B] + [E] * 10, TH, warned_for=15).action == Action.CLEAR
    # A burst before the warning does not count against the grace.
    assert decide([E] * 60 + [B] + [E] * 20, TH, warned_for=15).action == Action.RECLAIM


def test_a_gpu_holding_memory_gets_the_longer_window() -> None:
    assert decide([L] * 119, TH, warned_for=None).action == Action.NONE
    v = decide([L] * 120, TH, warned_for=None)
    assert v.action == Action.WARN and v.loaded and v.window_min == 60 * LOADED_FACTOR
    assert decide([L] * 200, TH, warned_for=15).action == Action.RECLAIM  # the same grace


def test_missing_telemetry_never_counts_as_idle() -> None:
    assert decide([E] * 40 + [U] * 20 + [E], TH, warned_for=None).action == Action.NONE  # under 80% known
    assert decide([E] * 70 + [U], TH, warned_for=None).action == Action.NONE  # nothing known now
    assert decide([E] * 70 + [U] * 15, TH, warned_for=15).action == Action.NONE  # a blind grace


def test_interactive_gets_extra_minutes_and_exempt_is_never_touched() -> None:
    assert decide([E] * 90, TH, warned_for=None, extra_min=60).action == Action.NONE
    assert decide([E] * 120, TH, warned_for=None, extra_min=60).action == Action.WARN
    assert decide([E] * 5000, TH, warned_for=5000, extra_min=None).action == Action.NONE


def test_unused_judged_by_the_gpus_in_the_first_minutes() -> None:
    th = Thresholds(unused_release_after_min=30)
    assert unused([E] * 30, th)
    assert not unused([E] * 29, th)  # too early to tell
    assert not unused([E] * 10 + [B] + [E] * 19, th)
    assert not unused([E] * 10 + [L] + [E] * 19, th)  # memory loaded: someone is using it
    assert not unused([U] * 20 + [E] * 10, th)  # mostly no data: no evidence
    assert not unused([E] * 30, Thresholds(unused_release_after_min=0))  # 0 turns it off
