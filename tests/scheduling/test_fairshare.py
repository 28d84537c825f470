"""Decayed usage: half-life, exact integral, ratios against shares."""

from __future__ import annotations

import math

import pytest

from apps.jobs.scheduling import DEFAULT_HALF_LIFE_S, UsageLedger, decayed_gpu_seconds, usage_ratios
from apps.jobs.scheduling.fairshare import fairshare_penalty

HOUR = 3600.0


def test_usage_halves_after_one_half_life() -> None:
    ledger = UsageLedger(half_life_s=HOUR)
    ledger.add("a", 1, 0.0, 1.0)
    assert ledger.usage("a", 1.0 + HOUR) == pytest.approx(ledger.usage("a", 1.0) / 2)


def test_half_life_is_configurable() -> None:
    fast, slow = UsageLedger(half_life_s=HOUR), UsageLedger(half_life_s=10 * HOUR)
    for ledger in (fast, slow):
        ledger.add("a", 4, 0.0, HOUR)
    assert fast.usage("a", 5 * HOUR) < slow.usage("a", 5 * HOUR)
    assert UsageLedger().half_life_s == DEFAULT_HALF_LIFE_S


def test_decayed_interval_is_the_exact_integral_and_splits_cleanly() -> None:
    h = 2 * HOUR
    whole = decayed_gpu_seconds(2, 0.0, 3 * HOUR, 5 * HOUR, h)
    parts = decayed_gpu_seconds(2, 0.0, HOUR, 5 * HOUR, h) + decayed_gpu_seconds(2, HOUR, 3 * HOUR, 5 * HOUR, h)
    assert whole == pytest.approx(parts)
    lam = math.log(2) / h
    assert whole == pytest.approx(2 * (math.exp(-lam * 2 * HOUR) - math.exp(-lam * 5 * HOUR)) / lam)
    # Without decay it would be 6 GPU-hours; with it, less.
    assert whole < 6 * HOUR


def test_ledger_counts_running_jobs_until_now() -> None:
    ledger = UsageLedger(half_life_s=HOUR)
    usage = ledger.snapshot(2 * HOUR, [("a", 1.0, 0.0)])
    assert usage["a"] == pytest.approx(decayed_gpu_seconds(1, 0.0, 2 * HOUR, 2 * HOUR, HOUR))


def test_usage_ratios_compare_usage_fraction_to_share_fraction() -> None:
    ratios = usage_ratios({"a": 300.0, "b": 100.0}, {"a": 1, "b": 1}, ["a", "b"])
    assert ratios == pytest.approx({"a": 1.5, "b": 0.5})
    assert usage_ratios({}, {}, ["a"]) == {"a": 0.0}


def test_penalty_grows_with_ratio_and_is_bounded() -> None:
    values = [fairshare_penalty(r) for r in (0.0, 0.5, 1.0, 4.0, math.inf)]
    assert values == sorted(values)
    assert values[0] == 0.0 and values[2] == pytest.approx(0.5) and values[-1] == 1.0


def test_half_life_must_be_positive() -> None:
    with pytest.raises(ValueError):
        UsageLedger(half_life_s=0)
