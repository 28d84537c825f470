"""The idle decision alone (no database): minute kinds, streaks, the loaded GPU's longer limit, warn-before-
reclaim, the grace after a warning, exemptions and unused reservations."""

from __future__ import annotations

from apps.efficiency.detector import (
    LOADED_FACTOR,
    Action,
    MinuteKind,
    Sample,
    Thresholds,
    combine,
    decide,
    minute_kind,
    trailing_streak,
    unused,
)

TH = Thresholds(warn_after_min=30, reclaim_after_min=30, utilization_below_pct=5, memory_below_pct=10)
E, L, B, U = MinuteKind.EMPTY, MinuteKind.LOADED, MinuteKind.BUSY, MinuteKind.UNKNOWN


def test_minute_kinds_follow_the_thresholds() -> None:
    assert minute_kind(Sample(util=4.9, mem_used=100, mem_total=80000), TH) == E
    assert minute_kind(Sample(util=5, mem_used=100, mem_total=80000), TH) == B
    assert minute_kind(Sample(util=0, mem_used=8000, mem_total=80000), TH) == L
    assert minute_kind(Sample(util=0, mem_used=7999, mem_total=80000), TH) == E
    assert minute_kind(Sample(util=None, mem_used=0, mem_total=80000), TH) == U
    assert minute_kind(None, TH) == U


def test_an_allocation_is_idle_only_when_every_gpu_is() -> None:
    assert combine([E, E]) == E
    assert combine([E, L]) == L
    assert combine([E, B]) == B
    assert combine([E, U]) == U
    assert combine([U, B]) == B


def test_streak_is_the_idle_run_ending_now() -> None:
    assert trailing_streak([E, E, B, E, L, E]) == (3, True)
    assert trailing_streak([E, E, U, E]) == (1, False)
    assert trailing_streak([E, B]) == (0, False)


def test_warning_comes_at_warn_after_and_not_before() -> None:
    assert decide([B] + [E] * 29, TH, warned_for=None).action == Action.NONE
    v = decide([B] + [E] * 30, TH, warned_for=None)
    assert v.action == Action.WARN and v.idle_minutes == 30 and not v.loaded


def test_reclaim_needs_a_warning_and_its_full_grace() -> None:
    # A long streak seen for the first time is warned, not reclaimed.
    assert decide([E] * 500, TH, warned_for=None).action == Action.WARN
    assert decide([E] * 500, TH, warned_for=29).action == Action.NONE
    v = decide([E] * 500, TH, warned_for=30)
    assert v.action == Action.RECLAIM and v.reclaim_after == 60


def test_a_gpu_holding_memory_gets_the_longer_limit() -> None:
    assert decide([L] * 59, TH, warned_for=None).action == Action.NONE
    v = decide([L] * 60, TH, warned_for=None)
    assert v.action == Action.WARN and v.loaded and v.warn_after == 30 * LOADED_FACTOR
    assert decide([L] * 100, TH, warned_for=59).action == Action.NONE
    assert decide([L] * 120, TH, warned_for=60).action == Action.RECLAIM


def test_missing_telemetry_never_counts_as_idle() -> None:
    assert decide([E] * 40 + [U] + [E] * 10, TH, warned_for=None).action == Action.NONE


def test_busy_again_after_a_warning_clears_it() -> None:
    assert decide([E] * 40 + [B], TH, warned_for=5).action == Action.CLEAR


def test_interactive_gets_extra_minutes_and_exempt_is_never_touched() -> None:
    assert decide([E] * 40, TH, warned_for=None, extra_min=60).action == Action.NONE
    assert decide([E] * 90, TH, warned_for=None, extra_min=60).action == Action.WARN
    assert decide([E] * 5000, TH, warned_for=5000, extra_min=None).action == Action.NONE


def test_unused_judged_by_the_gpus_in_the_first_minutes() -> None:
    th = Thresholds(unused_release_after_min=30)
    assert unused([E] * 30, th)
    assert not unused([E] * 29, th)  # too early to tell
    assert not unused([E] * 10 + [B] + [E] * 19, th)
    assert not unused([E] * 10 + [L] + [E] * 19, th)  # memory loaded: someone is using it
    assert not unused([U] * 20 + [E] * 10, th)  # mostly no data: no evidence
    assert not unused([E] * 30, Thresholds(unused_release_after_min=0))  # 0 turns it off
