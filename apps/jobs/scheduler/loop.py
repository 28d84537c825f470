"""The scheduler process's loop: wait to lead; while leading, pass every `interval` seconds and whenever woken.

A pass runs every `interval` seconds and when a service pushes to the Redis list `jobs:scheduler:wake` (job
submitted or ended, reservation ended). The leader also runs the jobs sweep (lost nodes, lost launches, overdue
jobs) and moves reservations at their start and end.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable

from django.db import close_old_connections
from django.utils import timezone
from redis import Redis

from apps.core.redis import get_redis
from apps.jobs import conf
from apps.jobs.events import WAKE_KEY
from apps.jobs.scheduler.apply import PassResult, run_pass
from apps.jobs.scheduler.leadership import Leadership, NotLeader, PostgresLeadership
from apps.jobs.scheduler.snapshot import UsageCache
from apps.jobs.scheduling import Policy, policy_by_name
from apps.jobs.services.sweep import jobs_sweep

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 2.0
WAKE_BATCH_S = 0.02
BOUNDARY_CHECK_S = 0.5  # how often the leader looks for reservations whose start or end has come


def configured_policy(name: str) -> Policy:
    """The built-in policy ``name`` with this installation's long-work knobs (``SCHEDULER_*`` settings)."""
    return dataclasses.replace(
        policy_by_name(name),
        gang_nodes_kept=conf.SCHEDULER_GANG_NODES_KEPT,
        long_job_s=conf.SCHEDULER_LONG_JOB_S,
        long_job_patience_s=conf.SCHEDULER_LONG_JOB_PATIENCE_S,
    )


class SchedulerLoop:
    """Wait to lead; while leading, pass every `interval` seconds and whenever woken."""

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        interval: float = conf.SCHEDULER_INTERVAL_S,
        leadership: Leadership | None = None,
        redis: Redis | None = None,
        name: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.policy = policy or configured_policy(conf.SCHEDULER_POLICY)
        self.interval = interval
        self.redis = redis or get_redis()
        self.leadership = leadership or PostgresLeadership()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.log = log or logger.info
        self.stopping = False
        self.leading = False
        self.usage = UsageCache()
        self.last_sweep = 0.0
        self.last_boundary_check = 0.0
        self.batch_s = WAKE_BATCH_S
        self.last_pass_started = 0.0

    def stop(self) -> None:
        self.stopping = True

    def wait(self, timeout: float) -> None:
        """Sleep until woken by a service (BLPOP on the wake list) or `timeout` passes."""
        if timeout <= 0:
            return
        try:
            if self.redis.blpop([WAKE_KEY], timeout=max(0.01, timeout)):
                # Woken: gather what else arrives in the next few milliseconds, so a burst of submissions costs
                # one pass (snapshot + apply) instead of one per job; then one pass answers them all. Passes
                # start at most every SCHEDULER_MIN_PASS_GAP_S: under a steady stream of submissions and exits (tens a
                # second) a pass per wake-up cost the database more than the jobs did, and a pass that comes a
                # little later starts more jobs at once (one batch).
                since = time.monotonic() - self.last_pass_started
                time.sleep(min(max(self.batch_s, conf.SCHEDULER_MIN_PASS_GAP_S - since), max(0.0, timeout)))
                self.redis.delete(WAKE_KEY)
        except Exception as exc:
            logger.warning("scheduler wake list: %s", exc)
            time.sleep(min(timeout, 1.0))

    def step(self) -> PassResult | None:
        """One iteration: make sure we lead, then pass. Returns the pass's result (None when not leading)."""
        close_old_connections()
        self.last_pass_started = time.monotonic()
        if not self.leading:
            if not self.leadership.acquire():
                return None
            self.leading = True
            self.usage = UsageCache()
            self.log(f"scheduler {self.name}: leading (token {self.leadership.token}, policy {self.policy.name})")
        elif not self.leadership.still_leader():
            self.leading = False
            self.log(f"scheduler {self.name}: lost the leadership")
            return None
        try:
            if time.monotonic() - self.last_sweep > SWEEP_EVERY_S:
                jobs_sweep()
                self.last_sweep = time.monotonic()
            self.reservation_boundaries()
            result = run_pass(token=self.leadership.token, leader=self.name, policy=self.policy, usage=self.usage)
        except NotLeader as exc:
            self.log(f"scheduler {self.name}: stepping down: {exc}")
            self.leadership.release()
            self.leading = False
            return None
        if result.started or result.stopped:
            logger.info(
                "pass: started %s, stopped %s, %d pending, %.1f ms",
                result.started,
                result.stopped,
                result.pending - len(result.started),
                result.ms,
            )
        return result

    def reservation_boundaries(self) -> None:
        """Activate and release reservations at their start and end, not up to the beat's 15 s tick later: the
        agents learn their holds, the team's jobs get the GPUs and the ended-hook runs on time. The tick stays as
        the backstop (a scheduler that is down); each move is a conditional update, so both running is harmless."""
        from apps.booking.selectors import reservations_due
        from apps.booking.services import reservations_tick

        if time.monotonic() - self.last_boundary_check < BOUNDARY_CHECK_S:
            return  # a burst of wake-ups: one look per BOUNDARY_CHECK_S is on time enough
        self.last_boundary_check = time.monotonic()
        try:
            now = timezone.now()
            if reservations_due(now=now):
                moved = reservations_tick(now=now)
                if moved["activated"] or moved["released"]:
                    logger.info("reservations: activated %s, released %s", moved["activated"], moved["released"])
        except Exception:  # booking's trouble must not stop job scheduling
            logger.exception("moving reservations at their boundaries failed")

    def run(self) -> None:
        self.log(f"scheduler {self.name}: waiting for the leadership")
        try:
            while not self.stopping:
                t0 = time.monotonic()
                try:
                    self.step()
                except Exception:
                    logger.exception("scheduler pass failed")
                    close_old_connections()
                remaining = self.interval - (time.monotonic() - t0)
                if self.leading:
                    self.wait(remaining)
                elif remaining > 0:
                    time.sleep(remaining)
        finally:
            self.leadership.release()
            self.log(f"scheduler {self.name}: stopped")
