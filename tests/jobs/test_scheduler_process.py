"""`manage.py scheduler` as real processes: one leader at a time; when the leader is SIGKILLed a standby takes
over and keeps scheduling; a wake-up (job submitted) starts a job well within the one-second interval."""

from __future__ import annotations

import time

import pytest

from apps.jobs.models import Job, JobEvent, JobState, SchedulerState
from tests.fleet.procs import wait_for
from tests.jobs.stack import start_scheduler

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _starting(job_id: int) -> bool:
    return Job.objects.filter(pk=job_id, state=JobState.STARTING).exists()


def test_one_leader_and_a_standby_takes_over_when_it_dies(tmp_path, alice, vision, submit) -> None:
    first = start_scheduler(tmp_path, INTERVAL="0.3")
    second = start_scheduler(tmp_path, INTERVAL="0.3")
    procs = [first, second]
    try:
        job1 = submit(alice, vision)
        wait_for(lambda: _starting(job1.pk), 20, "the first job to start", procs)
        leader_name = SchedulerState.objects.get(pk=1).leader
        leader = next(p for p in procs if leader_name.endswith(f":{p.pid}"))
        standby = next(p for p in procs if p is not leader)
        token_before = SchedulerState.objects.get(pk=1).fence

        leader.kill()
        job2 = submit(alice, vision)
        t0 = time.monotonic()
        wait_for(lambda: _starting(job2.pk), 30, "the standby to take over and start the second job", procs)
        takeover_s = time.monotonic() - t0
        state = SchedulerState.objects.get(pk=1)
        assert state.leader.endswith(f":{standby.pid}")
        assert state.fence > token_before
        assert takeover_s < 15, takeover_s
        for job in (job1, job2):
            assert JobEvent.objects.filter(job=job, to_state="starting").count() == 1
        assert set(Job.objects.get(pk=job1.pk).gpus.all()).isdisjoint(Job.objects.get(pk=job2.pk).gpus.all())

        # While leading and idle, a submission wakes it at once (no waiting for the next interval).
        time.sleep(1.0)
        job3 = submit(alice, vision)
        t0 = time.monotonic()
        wait_for(lambda: _starting(job3.pk), 10, "the third job", procs)
        assert time.monotonic() - t0 < 2.0
    finally:
        for p in procs:
            p.stop()
