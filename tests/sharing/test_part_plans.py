"""Jobs on parts that do not fit get a planned start, and later jobs may take the planned parts only if they give
them back in time (backfill for shares and MIG instances, as for whole GPUs)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Allocation, MaintenanceWindow
from apps.booking.services import allocations_end_of_job
from apps.jobs import scheduler, services
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import BACKFILL

pytestmark = pytest.mark.django_db


def submit(user: Any, team: Any, *, max_duration_s: int = 600, **fields: Any) -> Job:
    return services.job_submit(
        user=user,
        team=team,
        image="portal-test/busybox:latest",
        command=["true"],
        max_duration_s=max_duration_s,
        **fields,
    )


def one_pass(now: Any = None) -> scheduler.PassResult:
    # Arrival order (backfill), so the test decides who is ahead, not fair share's size penalty.
    return scheduler.run_pass(token=1, leader="test", policy=BACKFILL, now=now)


def test_a_half_waits_for_two_shares_and_later_quarters_do_not_take_them(alice, vision, ready, sent):
    held = [submit(alice, vision, gpu_share=0.25, max_duration_s=600 * (i + 1)) for i in range(3)]
    assert set(one_pass().started) == {j.pk for j in held}  # one share of four left
    half = submit(alice, vision, gpu_share=0.5)
    long_quarter = submit(alice, vision, gpu_share=0.25, max_duration_s=7200)
    short_quarter = submit(alice, vision, gpu_share=0.25, max_duration_s=60)

    started = one_pass().started
    # The half is planned on the free share and the first one that ends; a quarter that would still hold the free
    # share then waits, while one that ends before fills the gap.
    assert half.pk not in started and long_quarter.pk not in started
    assert started == [short_quarter.pk]
    half.refresh_from_db()
    assert half.pending_reason == "next_in_line"
    assert "0.5 of a shared GPU on GPU 0 of shared is planned for it in 12 min at the latest" in half.pending_message
    long_quarter.refresh_from_db()
    assert long_quarter.state == JobState.QUEUED
    # Its own plan comes after the half's: the share the second quarter holds.
    assert long_quarter.pending_reason == "next_in_line"
    assert "is planned for it in 22 min" in long_quarter.pending_message

    # The first quarter and the short one end: the half starts on two shares; the long quarter waits for its plan.
    allocations_end_of_job(job_id=held[0].pk, at=timezone.now())
    allocations_end_of_job(job_id=short_quarter.pk, at=timezone.now())
    assert one_pass().started == [half.pk]
    assert Allocation.objects.filter(active=True, job_id=half.pk).count() == 2
    assert Allocation.objects.filter(active=True, gpu__kind="share", end__gt=timezone.now()).count() == 4
    allocations_end_of_job(job_id=held[1].pk, at=timezone.now())
    assert one_pass().started == [long_quarter.pk]


def test_without_a_plan_a_stream_of_quarters_would_starve_the_half(alice, vision, ready, sent):
    """The same queue in passes: each time a share frees, the half (ahead in line) is the one that gets it."""
    held = [submit(alice, vision, gpu_share=0.25, max_duration_s=3600) for _ in range(4)]
    assert set(one_pass().started) == {j.pk for j in held}
    half = submit(alice, vision, gpu_share=0.5)
    later = [submit(alice, vision, gpu_share=0.25, max_duration_s=3600) for _ in range(3)]
    for ended in held[:2]:
        allocations_end_of_job(job_id=ended.pk, at=timezone.now())
        started = one_pass().started
        assert not set(started) & {j.pk for j in later}, "a later quarter took a share planned for the half"
    assert Job.objects.get(pk=half.pk).state == JobState.STARTING


def test_a_waiting_mig_job_is_told_when_and_where(alice, vision, ready, sent):
    holders = [submit(alice, vision, mig_profile="1g.10gb", max_duration_s=3600) for _ in range(7)]
    assert len(one_pass().started) == 7
    waiting = submit(alice, vision, mig_profile="1g.10gb")
    now = timezone.now()
    assert one_pass(now).started == []
    waiting.refresh_from_db()
    assert waiting.pending_reason == "next_in_line"
    assert "a 1g.10gb MIG instance on GPU 0 of mig is planned for it in 62 min at the latest" in (
        waiting.pending_message
    )
    allocations_end_of_job(job_id=holders[0].pk, at=now + timedelta(seconds=1))
    assert waiting.pk in one_pass(now + timedelta(seconds=2)).started


def test_a_plan_waits_out_a_maintenance_window_of_the_node(alice, vision, ready, sent):
    now = timezone.now()
    shared = ready["shared"]
    MaintenanceWindow.objects.create(node=shared.node, start=now - timedelta(minutes=1), end=now + timedelta(hours=2))
    quarter = submit(alice, vision, gpu_share=0.25)
    assert one_pass(now).started == []
    quarter.refresh_from_db()
    assert quarter.pending_reason == "next_in_line"
    assert "0.25 of a shared GPU on GPU 0 of shared is planned for it in 2.0 h at the latest" in quarter.pending_message


def test_a_plan_by_memory_takes_the_profile_that_frees_first(alice, vision, ready, sent):
    holders = [submit(alice, vision, mig_profile="1g.10gb", max_duration_s=600 * (i + 1)) for i in range(7)]
    assert len(one_pass().started) == 7
    by_memory = submit(alice, vision, mig_memory_mib=9000)
    assert one_pass().started == []
    by_memory.refresh_from_db()
    assert by_memory.pending_reason == "next_in_line"
    assert (
        "a MIG instance with 9000 MiB or more on GPU 0 of mig is planned for it in 12 min" in by_memory.pending_message
    )
    allocations_end_of_job(job_id=holders[0].pk, at=timezone.now())
    assert one_pass().started == [by_memory.pk]
    assert Job.objects.get(pk=by_memory.pk).mig_profile == "1g.10gb"


def test_a_fault_in_a_plan_does_not_stop_the_pass(alice, vision, ready, sent, monkeypatch, caplog):
    from apps.jobs.scheduler import part_plans

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("planner fault")

    monkeypatch.setattr(part_plans.PartPlanner, "_earliest", broken)
    holders = [submit(alice, vision, mig_profile="1g.10gb") for _ in range(7)]
    assert len(one_pass().started) == 7
    waiting = submit(alice, vision, mig_profile="1g.10gb")
    quarter = submit(alice, vision, gpu_share=0.25)
    assert one_pass().started == [quarter.pk]
    waiting.refresh_from_db()
    assert waiting.pending_reason == "waiting_for_gpus"
    assert "planning the start of job" in caplog.text
    assert len(holders) == 7


def test_a_job_whose_part_the_layout_no_longer_gives_is_told_so(alice, vision, ready, sent):
    """Admins changed the layout under queued jobs (the GPU split in 4 is now split in 3; the MIG GPU left MIG
    mode): they cannot start until a GPU gives their part again, and their reason says that, not "waiting for
    GPUs". Once the layout gives the part again, they start."""
    from apps.fleet.devices import gpu_set_shares, mig_layout_apply
    from apps.fleet.models import Gpu
    from tests.sharing.conftest import seven_1g

    quarter = submit(alice, vision, gpu_share=0.25)
    mig_job = submit(alice, vision, mig_profile="1g.10gb")
    by_memory = submit(alice, vision, mig_memory_mib=9000)
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=3)
    mig = Gpu.objects.get(uuid="GPU-mig-0")
    mig_layout_apply(gpu=mig, mig_mode=False, instances=[])
    third = submit(alice, vision, gpu_share="0.333333")

    assert one_pass().started == [third.pk]  # a third of a GPU split in 3 is one share
    quarter.refresh_from_db()
    assert quarter.state == JobState.QUEUED
    assert quarter.pending_reason == "part_not_in_layout"
    assert quarter.pending_message.startswith(
        "cannot start on the GPUs as they are laid out now: No GPU is split so that 0.25 of it is a whole number "
        "of shares (splits: 1/3)."
    )
    mig_job.refresh_from_db()
    assert mig_job.pending_reason == "part_not_in_layout"
    assert "No MIG instance of profile '1g.10gb'" in mig_job.pending_message
    assert "cancel it to ask for another part" in mig_job.pending_message
    by_memory.refresh_from_db()
    assert by_memory.pending_reason == "part_not_in_layout"
    assert "No MIG instance in the fleet has 9000 MiB of memory or more." in by_memory.pending_message

    # The admins lay the GPUs out as before: the jobs start.
    allocations_end_of_job(job_id=third.pk, at=timezone.now())
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=4)
    mig_layout_apply(gpu=Gpu.objects.get(pk=mig.pk), mig_mode=True, instances=seven_1g(mig.uuid))
    assert set(one_pass().started) == {quarter.pk, mig_job.pk, by_memory.pk}


def test_a_job_that_only_waits_for_a_part_is_not_told_the_layout_lacks_it(alice, vision, ready, sent):
    held = [submit(alice, vision, gpu_share=0.25, max_duration_s=3600) for _ in range(4)]
    assert set(one_pass().started) == {j.pk for j in held}
    waiting = submit(alice, vision, gpu_share=0.25)
    assert one_pass().started == []
    waiting.refresh_from_db()
    assert waiting.pending_reason == "next_in_line"
