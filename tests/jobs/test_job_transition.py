"""job_transition: the one state machine. Legal moves apply with their side effects; illegal and racing ones are
refused (a conditional UPDATE on the current state)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.booking.models import Allocation, QuotaHold
from apps.core.errors import Conflict
from apps.jobs import services
from apps.jobs.models import TRANSITIONS, Job, JobEvent, JobReason, JobState
from apps.jobs.services import TransitionRefused


def _start(job, fleet, n=1):
    return services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:n], now=timezone.now())


@pytest.mark.django_db
def test_a_job_goes_queued_starting_running_succeeded(alice, vision, fleet, submit):
    job = submit(alice, vision, gpu_count=2)
    job = _start(job, fleet, 2)
    assert job.state == JobState.STARTING and job.node == fleet["node01"]
    assert Allocation.objects.filter(job_id=job.pk, active=True).count() == 2
    assert job.hourly_price == 5  # two A100 at 2.5

    job = services.job_transition(job, JobState.RUNNING)
    assert job.started_at is not None
    job = services.job_transition(job, JobState.SUCCEEDED, reason=JobReason.EXIT_CODE, exit_code=0)

    assert (job.state, job.reason, job.exit_code) == ("succeeded", "exit_code", 0)
    assert job.ended_at >= job.started_at
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True)) == [
        "queued",
        "starting",
        "running",
        "succeeded",
    ]
    for alloc in Allocation.objects.filter(job_id=job.pk):
        assert alloc.end <= timezone.now()
    hold = QuotaHold.objects.get(job_id=job.pk)
    assert hold.end - hold.start < timedelta(minutes=1)  # settled to the real runtime, not max_duration


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], JobState.RUNNING),
        ([], JobState.SUCCEEDED),
        ([], JobState.LOST),
        ([JobState.STARTING, JobState.RUNNING], JobState.QUEUED),
        ([JobState.STARTING, JobState.RUNNING], JobState.STARTING),
        ([JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED], JobState.RUNNING),
        ([JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED], JobState.FAILED),
        ([JobState.CANCELLED], JobState.QUEUED),
        ([JobState.STARTING, JobState.LOST], JobState.RUNNING),
    ],
)
def test_illegal_moves_are_refused(alice, vision, fleet, submit, path, illegal):
    job = submit(alice, vision)
    for state in path:
        if state == JobState.STARTING:
            job = _start(job, fleet)
        else:
            job = services.job_transition(job, state, reason=JobReason.CANCELLED if state == "cancelled" else "")
    before = job.state
    with pytest.raises(TransitionRefused) as caught:
        services.job_transition(job, illegal)
    assert caught.value.status == 409
    assert Job.objects.get(pk=job.pk).state == before


def test_terminal_states_have_no_way_out():
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST):
        assert TRANSITIONS[state] == frozenset()


@pytest.mark.django_db
def test_a_stale_copy_loses_to_the_transition_that_got_there_first(alice, vision, fleet, submit):
    job = _start(submit(alice, vision), fleet)
    job = services.job_transition(job, JobState.RUNNING)
    stale = Job.objects.get(pk=job.pk)

    services.job_transition(job, JobState.SUCCEEDED, reason=JobReason.EXIT_CODE, exit_code=0)
    with pytest.raises(TransitionRefused):
        services.job_transition(stale, JobState.CANCELLED, reason=JobReason.CANCELLED)

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert JobEvent.objects.filter(job=job, to_state__in=["succeeded", "cancelled"]).count() == 1


@pytest.mark.django_db
def test_lost_job_frees_its_gpus_from_the_last_heartbeat(alice, vision, fleet, submit):
    job = _start(submit(alice, vision), fleet)
    job = services.job_transition(job, JobState.RUNNING)
    heartbeat = timezone.now()
    assert services.job_mark_lost(job=job, message="node gone", allocation_end=heartbeat)
    job.refresh_from_db()
    assert (job.state, job.reason) == ("lost", "node_lost")
    alloc = Allocation.objects.get(job_id=job.pk)
    assert alloc.end == heartbeat


@pytest.mark.django_db
def test_two_jobs_cannot_be_started_on_one_gpu(alice, vision, fleet, submit):
    first = _start(submit(alice, vision), fleet)
    second = submit(alice, vision)
    with pytest.raises(Conflict):
        _start(second, fleet)
    second.refresh_from_db()
    assert first.state == JobState.STARTING
    assert second.state == JobState.QUEUED
    assert second.node is None


@pytest.mark.django_db(transaction=True)
def test_racing_transitions_on_postgres_have_exactly_one_winner(alice, vision, fleet, submit):
    job = _start(submit(alice, vision), fleet)
    services.job_transition(job, JobState.RUNNING)
    targets = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST] * 3
    barrier = threading.Barrier(len(targets))
    wins: list[str] = []
    refusals: list[str] = []

    def race(target: str) -> None:
        try:
            mine = Job.objects.get(pk=job.pk)
            barrier.wait()
            services.job_transition(mine, target, reason=JobReason.EXIT_CODE)
            wins.append(target)
        except TransitionRefused:
            refusals.append(target)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(refusals) == len(targets) - 1
    job.refresh_from_db()
    assert job.state == wins[0]
    assert JobEvent.objects.filter(job=job, from_state="running").count() == 1


@pytest.mark.django_db
def test_an_exit_that_carries_the_start_goes_straight_to_the_end_with_a_full_timeline(alice, vision, fleet, submit):
    job = _start(submit(alice, vision), fleet)
    began = timezone.now()
    assert services.job_report_exit(
        node_id=fleet["node01"].pk, job_id=job.pk, state="succeeded", reason="exit_code", exit_code=0,
        message="", finished_at=timezone.now(), log_total=0, started_at=began, handle="pid:42",
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.handle, job.started_at) == ("succeeded", "pid:42", began)
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True)) == [
        "queued", "starting", "running", "succeeded",
    ]  # fmt: skip
    # The separate start report, arriving late, changes nothing and stops nothing.
    assert services.job_report_started(node_id=fleet["node01"].pk, job_id=job.pk, handle="pid:42", at=began) == (
        "ignored"
    )


@pytest.mark.django_db
def test_a_start_report_for_a_job_the_portal_lost_asks_to_stop_it(alice, vision, fleet, submit):
    job = _start(submit(alice, vision), fleet)
    services.job_mark_lost(job=job, message="gone", allocation_end=timezone.now())
    verdict = services.job_report_started(node_id=fleet["node01"].pk, job_id=job.pk, handle="c1", at=None)
    assert verdict == "stop"
