"""The 1 Hz sampler loop, driven by a fake clock (schedule, skipping, failures) and once in real time (stop)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from workers.gpu.base import GpuInfo, GpuSample, parse_message
from workers.gpu.simulated import SimulatedBackend
from workers.sampler import Sampler

EPOCH = 1_767_225_600.0


class FakeClock:
    """Monotonic and wall clock in one; only waits and simulated work move it."""

    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return EPOCH + self.t


class ClockEvent(threading.Event):
    """A stop event whose wait() advances the fake clock instead of blocking."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        assert timeout is not None and timeout > 0
        self.waits.append(timeout)
        self.clock.t += timeout
        return self.is_set()


class SlowBackend:
    """Wraps a backend; each sample costs `cost` seconds of fake time (or a chosen amount on chosen ticks)."""

    def __init__(self, inner: SimulatedBackend, clock: FakeClock, cost: float, spikes: dict[int, float] | None = None):
        self.inner = inner
        self.clock = clock
        self.cost = cost
        self.spikes = spikes or {}
        self.calls: list[float] = []

    def discover(self) -> list[GpuInfo]:
        return self.inner.discover()

    def sample(self, now: float) -> list[GpuSample]:
        self.calls.append(now)
        self.clock.t += self.spikes.get(len(self.calls) - 1, self.cost)
        return self.inner.sample(now)

    def close(self) -> None:
        self.inner.close()


def make(
    ticks: int, *, cost: float = 0.0, spikes: dict[int, float] | None = None, send_fails: set[int] | None = None
) -> tuple[Sampler, SlowBackend, list[dict[str, Any]], ClockEvent]:
    clock = FakeClock()
    event = ClockEvent(clock)
    backend = SlowBackend(SimulatedBackend("node-t", ["A100-80GB"] * 8, seed=3), clock, cost, spikes)
    sent: list[dict[str, Any]] = []
    attempts = [0]

    def send(message: dict[str, Any]) -> None:
        attempts[0] += 1
        if len(backend.calls) >= ticks:
            event.set()
        if send_fails and attempts[0] - 1 in send_fails:
            raise ConnectionError("broker unreachable")
        sent.append(json.loads(json.dumps(message)))  # what goes over the wire must be JSON

    sampler = Sampler(backend, send, node="node-t", stop_event=event, monotonic=clock.monotonic, wall_time=clock.time)
    return sampler, backend, sent, event


def test_ticks_stay_on_the_grid_although_each_sample_costs_time() -> None:
    sampler, backend, sent, _ = make(100, cost=0.137)
    stats = sampler.run()
    assert stats.ticks == stats.samples == stats.sent == 100
    # Tick k happens at start + k seconds exactly: the 0.137 s of work per tick does not accumulate.
    start = backend.calls[0]
    assert backend.calls == [start + k for k in range(100)]
    assert [m["seq"] for m in sent] == list(range(100))
    assert [m["ts"] for m in sent] == [round(start + k, 3) for k in range(100)]
    assert stats.skipped_ticks == 0


def test_a_late_loop_drops_missed_ticks_and_realigns() -> None:
    # Tick 3 stalls for 3.5 s: due times 4, 5 and 6 have passed when it returns at 6.5; the next tick runs at 7.
    sampler, backend, _, _ = make(8, spikes={3: 3.5})
    stats = sampler.run()
    start = backend.calls[0]
    assert [t - start for t in backend.calls] == [0, 1, 2, 3, 7, 8, 9, 10]
    assert stats.skipped_ticks == 3


def test_slightly_late_tick_runs_at_once_without_skipping() -> None:
    sampler, backend, _, _ = make(5, spikes={1: 1.4})  # tick 2 (due at 2) starts at 2.4
    stats = sampler.run()
    start = backend.calls[0]
    assert [round(t - start, 6) for t in backend.calls] == [0, 1, 2.4, 3, 4]
    assert stats.skipped_ticks == 0


def test_send_failures_are_counted_and_do_not_stop_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    sampler, _, sent, _ = make(10, send_fails={2, 3, 4, 7})
    with caplog.at_level(logging.INFO, logger="workers.sampler"):
        stats = sampler.run()
    assert stats.ticks == 10
    assert stats.send_failures == 4
    assert stats.sent == 6
    assert [m["seq"] for m in sent] == [0, 1, 5, 6, 8, 9]  # seq numbers the attempts: gaps show the losses
    assert stats.last_error is not None and "broker unreachable" in stats.last_error
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # the first failure of each streak, not every tick
    assert warnings[0].exc_info is not None
    assert sum("works again" in r.getMessage() for r in caplog.records) == 2


def test_backend_exception_is_counted_and_the_next_tick_samples_again() -> None:
    sampler, backend, sent, _ = make(6)
    real_sample = backend.sample

    def flaky(now: float) -> list[GpuSample]:
        if len(backend.calls) == 2:
            backend.calls.append(now)
            raise RuntimeError("driver hiccup")
        return real_sample(now)

    backend.sample = flaky  # type: ignore[method-assign]
    stats = sampler.run()
    assert stats.sample_failures == 1
    assert stats.ticks == 6 and stats.samples == 5 and len(sent) == 5


def test_message_carries_every_gpu_and_decodes() -> None:
    sampler, _, sent, _ = make(12)
    sampler.run()
    node, _ts, seq, samples = parse_message(sent[10])
    assert node == "node-t" and seq == 10
    assert len(samples) == 8
    assert all(s.memory_total_mib == 81_920 and s.utilization_pct == 0 for s in samples)
    assert parse_message(sent[10])[3][0].processes == []  # tick 10 is a slow tick: processes read, none running
    assert parse_message(sent[11])[3][0].processes is None


def test_stop_ends_a_real_time_loop_promptly() -> None:
    sent: list[dict[str, Any]] = []
    sampler = Sampler(SimulatedBackend("rt", ["L40S-48GB"], seed=1), sent.append, node="rt", period_s=0.05)
    thread = sampler.start()
    time.sleep(0.5)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 0.5
    assert not thread.is_alive()
    # ~10 ticks in 0.5 s on a loaded machine: allow wide margins, but it must have ticked and not run away.
    assert 3 <= sampler.stats.ticks <= 12
    assert sampler.stats.sent == len(sent) == sampler.stats.ticks


def test_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period_s"):
        Sampler(SimulatedBackend("x", ["A100-80GB"]), lambda m: None, node="x", period_s=0)
