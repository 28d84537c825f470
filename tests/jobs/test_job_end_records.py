"""What a job's end writes on the worker's hot path: allocations cut at the end, the quota hold found and locked,
the job looked up with its node."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.booking import services as booking
from apps.booking.models import Allocation, QuotaHold
from apps.jobs import services
from apps.jobs.models import JobState

pytestmark = pytest.mark.django_db(transaction=True)


def _alloc(fleet, vision, *, job_id, gpu, start, end, active=True):
    return Allocation.objects.create(
        gpu=fleet["gpus01"][gpu], team=vision, kind="job", job_id=job_id, start=start, end=end, active=active
    )


def test_a_jobs_end_cuts_running_rows_drops_future_ones_and_leaves_the_rest(vision, fleet):
    at = timezone.now().replace(microsecond=0)
    h = timedelta(hours=1)
    running = _alloc(fleet, vision, job_id=7, gpu=0, start=at - h, end=at + h)
    future = _alloc(fleet, vision, job_id=7, gpu=1, start=at + h, end=at + 2 * h)
    starts_now = _alloc(fleet, vision, job_id=7, gpu=2, start=at, end=at + h)
    over = _alloc(fleet, vision, job_id=7, gpu=3, start=at - 2 * h, end=at - h)
    inactive = _alloc(fleet, vision, job_id=7, gpu=0, start=at + 3 * h, end=at + 4 * h, active=False)
    other_job = _alloc(fleet, vision, job_id=8, gpu=1, start=at - h, end=at)  # touches: [at - h, at)

    assert booking.allocations_end_of_job(job_id=7, at=at) == 3
    rows = {a.pk: a for a in Allocation.objects.all()}
    assert (rows[running.pk].active, rows[running.pk].end, rows[running.pk].ended_at) == (True, at, at)
    assert (rows[future.pk].active, rows[future.pk].end, rows[future.pk].ended_at) == (False, at + 2 * h, at)
    assert (rows[starts_now.pk].active, rows[starts_now.pk].end, rows[starts_now.pk].ended_at) == (False, at + h, at)
    for untouched, before in ((over, over), (inactive, inactive), (other_job, other_job)):
        row = rows[untouched.pk]
        assert (row.active, row.start, row.end, row.ended_at) == (before.active, before.start, before.end, None)
    # Idempotent: a second copy of the end report changes nothing.
    assert booking.allocations_end_of_job(job_id=7, at=at) == 0
    # A later end (a duplicate report with a later time) does not stretch what was cut.
    assert booking.allocations_end_of_job(job_id=7, at=at + h) == 0
    assert Allocation.objects.get(pk=running.pk).end == at


def test_job_on_node_only_for_its_own_node_and_with_the_node_loaded(
    alice, vision, fleet, submit, django_assert_num_queries
):
    job = submit(alice, vision, gpu_count=1, gpu_model="A100-80GB")
    services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    with django_assert_num_queries(1):
        found = services.job_on_node(job.pk, fleet["node01"].pk)
        assert found is not None and found.node.name == "node01"
    assert found.state == JobState.STARTING and found.command == ["echo", "hi"]
    assert found.scheduled_at is not None and found.scheduled_at.tzinfo is not None
    assert services.job_on_node(job.pk, fleet["node02"].pk) is None
    assert services.job_on_node(job.pk + 1000, fleet["node01"].pk) is None


def test_a_jobs_hold_is_found_settled_and_released(alice, vision, fleet, submit):
    job = submit(alice, vision, gpu_count=2, gpu_model="A100-80GB", max_duration_s=3600)
    hold = QuotaHold.objects.get(job_id=job.pk)
    start = hold.start
    settled = booking.quota_hold_update(job_id=job.pk, start=start, end=start + timedelta(minutes=30))
    assert settled is not None and settled.pk == hold.pk and settled.active
    assert QuotaHold.objects.get(pk=hold.pk).end == start + timedelta(minutes=30)
    released = booking.quota_hold_release(job_id=job.pk)
    assert released is not None and not released.active
    assert booking.quota_hold_update(job_id=job.pk + 1000, start=start, end=start) is None
