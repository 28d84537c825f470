"""The node agent's 1 Hz telemetry loop: sample every GPU, build one message, hand it to `send`.

Drift-free: tick k is due at start + k * period on the monotonic clock, whatever the previous tick cost, so a
sampler that takes 30 ms per tick still sends 3,600 messages an hour, not 3,495. A tick that starts late by less
than a period runs at once; when the loop fell behind by a whole period or more (a stalled broker call, a suspended
VM) the missed ticks are dropped and the loop waits for the next due time instead of firing a burst of stale
samples. The sample timestamps are wall-clock (what the portal stores), the schedule is monotonic (immune to NTP
steps).

Nothing that goes wrong inside a tick stops the loop: a failing `send` (broker down) or a failing backend is
counted and logged, first occurrence with its traceback and then once a minute while it persists, and the next
tick tries again. Only the stop event ends it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.gpu.base import GpuBackend, GpuSample, build_message

logger = logging.getLogger(__name__)

_LOG_EVERY = 60  # while a failure persists, one log line per this many failed ticks


@dataclass
class SamplerStats:
    """Counters of a sampler's life; read them from any thread (plain ints, updated by the loop only)."""

    ticks: int = 0  # ticks run (a message was attempted)
    samples: int = 0  # messages built from a successful backend.sample
    sent: int = 0
    send_failures: int = 0
    sample_failures: int = 0
    skipped_ticks: int = 0  # due ticks dropped because the loop was late by a whole period or more
    last_error: str | None = None


class Sampler:
    """Runs `backend.sample(now)` every `period_s` seconds and passes each message to `send(message)`."""

    def __init__(
        self,
        backend: GpuBackend,
        send: Callable[[dict[str, Any]], None],
        *,
        node: str,
        period_s: float = 1.0,
        stop_event: threading.Event | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_time: Callable[[], float] = time.time,
    ) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self.backend = backend
        self.send = send
        self.node = node
        self.period_s = period_s
        # Waiting on the event (not time.sleep) makes stop() take effect at once, mid-wait.
        self.stop_event = stop_event if stop_event is not None else threading.Event()
        self.stats = SamplerStats()
        self._monotonic = monotonic
        self._wall_time = wall_time
        self._thread: threading.Thread | None = None
        self._send_streak = 0
        self._sample_streak = 0
        # Set by the job runner once it exists (workers/jobmem.py): names the jobs behind the GPU memory.
        self.annotate: Callable[[list[GpuSample]], list[GpuSample]] | None = None

    def run(self) -> SamplerStats:
        """Loop until the stop event is set; returns the final counters."""
        start = self._monotonic()
        k = 0
        while not self.stop_event.is_set():
            due = start + k * self.period_s
            delay = due - self._monotonic()
            if delay > 0:
                if self.stop_event.wait(delay):
                    break
            elif -delay >= self.period_s:
                next_k = math.ceil((self._monotonic() - start) / self.period_s)
                next_k = max(next_k, k + 1)
                self.stats.skipped_ticks += next_k - k
                logger.warning("sampler fell %.1f s behind; dropped %d tick(s)", -delay, next_k - k)
                k = next_k
                continue
            self._tick(self._wall_time())
            k += 1
        return self.stats

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread (the agent's main thread serves the broker)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("sampler already running")
        self._thread = threading.Thread(target=self.run, name=f"gpu-sampler-{self.node}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 5.0) -> None:
        """Ask the loop to stop and wait for its thread (when started with start())."""
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _tick(self, now: float) -> None:
        self.stats.ticks += 1
        try:
            samples = self.backend.sample(now)
        except Exception as exc:  # a backend bug or driver hiccup must not end telemetry for the node
            self.stats.sample_failures += 1
            self.stats.last_error = f"sample: {exc!r}"
            self._sample_streak += 1
            self._log_failure("sampling GPUs", self._sample_streak, self.stats.sample_failures)
            return
        if self._sample_streak:
            logger.info("sampling GPUs works again after %d failed tick(s)", self._sample_streak)
            self._sample_streak = 0
        if self.annotate is not None:
            try:
                samples = self.annotate(samples)
            except Exception:  # attribution is an extra: the GPU readings still go out without it
                logger.warning("attributing GPU memory to jobs failed", exc_info=True)
        message = build_message(self.node, samples, ts=now, seq=self.stats.samples)
        self.stats.samples += 1
        try:
            self.send(message)
        except Exception as exc:  # broker down, serializer bug...: count, log, try again next tick
            self.stats.send_failures += 1
            self.stats.last_error = f"send: {exc!r}"
            self._send_streak += 1
            self._log_failure("sending telemetry", self._send_streak, self.stats.send_failures)
            return
        if self._send_streak:
            logger.info("sending telemetry works again after %d failed tick(s)", self._send_streak)
            self._send_streak = 0
        self.stats.sent += 1

    @staticmethod
    def _log_failure(what: str, streak: int, total: int) -> None:
        # Called from inside the except block, so exc_info picks up the exception being handled.
        if streak == 1:
            logger.warning("%s failed (total failures: %d)", what, total, exc_info=True)
        elif streak % _LOG_EVERY == 0:
            logger.warning("%s still failing: %d ticks in a row (total failures: %d)", what, streak, total)
