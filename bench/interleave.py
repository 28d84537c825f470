"""Interleaved CPU comparisons for `bench.internals_web`: each variant's CPU per call, the variants alternating in
an order rotated from round to round, and a report of the medians and of each variant's paired (same round)
difference from the base."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.internals_toggles import Toggle


def cpu_per_call(fn: Callable[[], Any], n: int) -> float:
    """Microseconds of this process's CPU per call of `fn`, over `n` calls."""
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def interleaved(
    variants: dict[str, tuple[Callable[[], Any], Toggle | None]], n: int, rounds: int
) -> dict[str, list[float]]:
    """µs per call of each variant in each round. Every round runs all variants, in an order rotated from round to
    round (state that grows, such as rows booked, favours no variant). A variant's toggle turns its piece off
    while it runs."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn, toggle = variants[name]
            if toggle is not None:
                toggle[0]()
            try:
                for _ in range(max(3, n // 20)):  # warm: plans, caches, prepared statements
                    fn()
                samples[name].append(cpu_per_call(fn, n))
            finally:
                if toggle is not None:
                    toggle[1]()
    return samples


def report(
    title: str,
    samples: dict[str, list[float]],
    base: str,
    path: bool = False,
    shares: list[tuple[str, float, int]] | None = None,
) -> None:
    """The median per call of each variant; for the others, the median of their per-round difference from `base`
    (paired: the same round), with the smallest and largest, and for a path that as a share of the base. `shares`:
    (path, its CPU per request, how often one request runs this) to show a micro saving as a share of each path."""
    print(f"\n{title}")
    base_us = statistics.median(samples[base])
    for name, values in samples.items():
        line = f"  {name:<36} {statistics.median(values):9.1f} µs"
        if name != base:
            diffs = sorted(v - b for v, b in zip(values, samples[base], strict=True))
            saving = statistics.median(diffs)
            line += f"   piece saves {saving:+8.1f} µs [{diffs[0]:+.0f}..{diffs[-1]:+.0f}]"
            if path:
                line += f" = {saving / base_us * 100:+5.1f}% of the path"
            for path_name, path_us, uses in shares or []:
                if uses:
                    line += f"\n{'':40}x {uses} per {path_name} = {saving * uses / path_us * 100:+5.1f}% of its CPU"
        print(line)
