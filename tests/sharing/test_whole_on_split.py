"""A whole-GPU job on a GPU split in shares: the scheduler gives it one only when all its shares are free, after the
exclusive GPUs (anywhere) and when no queued job asks for a share; the job holds all the shares (so no share can be
taken while it runs), is launched on the GPU with nothing of shares, and is billed the whole GPU's price.

Fleet (tests/sharing/conftest.py): node "mig" with GPU-mig-0 in MIG mode and the exclusive GPU-mig-1; node "shared"
with GPU-shared-0 split in 4 and the exclusive GPU-shared-1. A100-80GB at 2.80/h.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Allocation
from apps.booking.services import allocations_end_of_job, reservation_create
from apps.core.errors import Conflict
from apps.fleet.models import Gpu, GpuStatus
from apps.jobs import scheduler, services
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import FAIR
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


def submit(user: Any, team: Any, **fields: Any) -> Job:
    fields.setdefault("max_duration_s", 600)
    return services.job_submit(user=user, team=team, image="portal-test/busybox:latest", command=["true"], **fields)


def one_pass(now: Any = None) -> scheduler.PassResult:
    return scheduler.run_pass(token=1, leader="test", policy=FAIR, now=now)


def held_by(job: Job) -> list[Gpu]:
    return [a.gpu for a in Allocation.objects.filter(job_id=job.pk, active=True).select_related("gpu__parent")]


def shares_of_split(job: Job) -> set[str]:
    """The uuids of the GPUs whose shares the job holds, if it holds all 4 of GPU-shared-0's."""
    gpus = held_by(job)
    shares = [g for g in gpus if g.kind == "share"]
    return {g.parent.uuid for g in shares if g.parent is not None} if len(shares) == 4 else set()


def exclusive_gpus_lost() -> None:
    """Take the two exclusive GPUs out of the schedulable fleet: only the split one is left for whole-GPU jobs."""
    Gpu.objects.filter(uuid__in=["GPU-mig-1", "GPU-shared-1"]).update(status=GpuStatus.LOST)


def test_a_whole_gpu_job_takes_a_split_gpu_after_the_exclusive_ones_and_holds_all_its_shares(
    api_as, alice, vision, ready, sent, django_capture_on_commit_callbacks
):
    jobs = [submit(alice, vision) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        result = one_pass()
    assert sorted(result.started) == sorted(j.pk for j in jobs)
    on_split = [j for j in jobs if shares_of_split(j)]
    assert len(on_split) == 1  # the exclusive GPUs went first
    whole = on_split[0]
    assert {g.uuid for j in jobs if j is not whole for g in held_by(j)} == {"GPU-mig-1", "GPU-shared-1"}
    launch = next(b for b in sent if b["job_id"] == whole.pk)
    assert launch["gpu_uuids"] == ["GPU-shared-0"]
    assert "gpu_share" not in launch and "gpu_memory_mib" not in launch  # the whole GPU: no budget, no MPS limit
    assert Job.objects.get(pk=whole.pk).hourly_price == Decimal("2.8000")
    body = api_as(alice).get(f"/api/v1/jobs/{whole.pk}/").json()
    assert [(g["uuid"], g["share"]) for g in body["gpus"]] == [("GPU-shared-0", 1.0)]
    # The next pass sees it as holding one GPU (its fair-share weight), busy until the job's end.
    from apps.jobs.scheduler.snapshot import load_snapshot

    (running,) = [r for r in load_snapshot(timezone.now()).snapshot.running if r.id == str(whole.pk)]
    assert running.gpu_ids == (str(Gpu.objects.get(uuid="GPU-shared-0").pk),)

    # While it runs, no share of that GPU can be had: not by a job, not by a booking.
    quarter = submit(alice, vision, gpu_share=0.25)
    assert quarter.pk not in one_pass().started
    assert Job.objects.get(pk=quarter.pk).state == JobState.QUEUED
    now = timezone.now().replace(second=0, microsecond=0)
    this_slot = now - timedelta(minutes=now.minute % 15)  # the booking grid's current slot (UTC: whole hours)
    with pytest.raises(Conflict):
        reservation_create(
            user=alice, team=vision, start=this_slot, end=this_slot + timedelta(hours=1), gpu_share="0.25"
        )
    # When it ends, the shares are free again.
    allocations_end_of_job(job_id=whole.pk, at=timezone.now())
    Job.objects.filter(pk=whole.pk).update(state=JobState.SUCCEEDED)
    assert one_pass().started == [quarter.pk]


def test_a_held_share_keeps_whole_gpu_jobs_off_the_gpu_until_it_ends(alice, vision, ready, sent):
    exclusive_gpus_lost()
    quarter = submit(alice, vision, gpu_share=0.25)
    assert one_pass().started == [quarter.pk]
    whole = submit(alice, vision)
    assert one_pass().started == []
    allocations_end_of_job(job_id=quarter.pk, at=timezone.now())
    Job.objects.filter(pk=quarter.pk).update(state=JobState.SUCCEEDED)
    assert one_pass().started == [whole.pk]
    assert shares_of_split(whole) == {"GPU-shared-0"}


def test_queued_share_jobs_keep_the_split_gpu_from_whole_gpu_jobs_that_came_first(alice, vision, ready, sent):
    """Shares are what the GPU was split for: a queued share job (of its model, or of any) has it, even after a
    whole-GPU job of higher priority."""
    exclusive_gpus_lost()
    whole = submit(alice, vision, priority=5)
    quarter = submit(alice, vision, gpu_share=0.25)
    assert one_pass().started == [quarter.pk]
    assert Job.objects.get(pk=whole.pk).state == JobState.QUEUED
    other_model = submit(alice, vision, gpu_share=0.25, gpu_models=["H100-80GB"], check_fleet=False)
    allocations_end_of_job(job_id=quarter.pk, at=timezone.now())
    Job.objects.filter(pk=quarter.pk).update(state=JobState.SUCCEEDED)
    # A share job that cannot use this GPU's model does not hold it back.
    assert one_pass().started == [whole.pk]
    assert Job.objects.get(pk=other_model.pk).state == JobState.QUEUED


def test_a_booked_share_later_keeps_a_long_whole_gpu_job_off_and_lets_a_short_one_run(alice, vision, ready, sent):
    exclusive_gpus_lost()
    start, end = slot(hours=2)
    reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.25")
    before = start - timedelta(minutes=30)
    long = submit(alice, vision, max_duration_s=2 * 3600)
    assert one_pass(before).started == []
    short = submit(alice, vision, max_duration_s=600)
    assert one_pass(before).started == [short.pk]
    assert shares_of_split(short) == {"GPU-shared-0"}
    assert Job.objects.get(pk=long.pk).state == JobState.QUEUED


def test_a_gang_takes_an_exclusive_gpu_and_a_split_one_of_its_node(
    alice, vision, ready, sent, django_capture_on_commit_callbacks
):
    Gpu.objects.filter(uuid="GPU-mig-1").update(status=GpuStatus.LOST)
    gang = submit(alice, vision, gpu_count=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert one_pass().started == [gang.pk]
    held = held_by(gang)
    assert sorted(g.uuid for g in held if g.kind == "gpu") == ["GPU-shared-1"]
    assert shares_of_split(gang) == {"GPU-shared-0"}
    launch = next(b for b in sent if b["job_id"] == gang.pk)
    assert sorted(launch["gpu_uuids"]) == ["GPU-shared-0", "GPU-shared-1"] and "gpu_share" not in launch
    assert Job.objects.get(pk=gang.pk).hourly_price == Decimal("5.6000")


def test_a_split_gpu_whose_shares_are_being_relaid_is_not_taken_whole(alice, vision, ready, sent):
    """Its live shares are not its N (a layout change under way): no whole-GPU job lands on a half-made layout."""
    exclusive_gpus_lost()
    shared = Gpu.objects.get(uuid="GPU-shared-0")
    Gpu.devices.filter(parent=shared, index=3).update(retired_at=timezone.now())
    whole = submit(alice, vision)
    assert one_pass().started == []
    assert Job.objects.get(pk=whole.pk).state == JobState.QUEUED


def test_a_whole_gpu_job_only_gpus_in_mig_mode_could_hold_is_400_not_a_job_that_waits_forever(alice, vision, ready):
    from apps.core.errors import ValidationFailed
    from tests.factories import GpuFactory, GpuModelFactory

    a30 = GpuModelFactory(name="A30-24GB", memory_mib=24576)
    node = Gpu.objects.get(uuid="GPU-mig-0").node
    GpuFactory(node=node, index=2, model=a30, uuid="GPU-a30-0", mig_mode=True)
    with pytest.raises(ValidationFailed) as refused:
        submit(alice, vision, gpu_models=["A30-24GB"])
    assert "MIG mode" in str(refused.value.detail)
    # Node "mig" has two A100s, one of them in MIG mode: two whole A100s fit only on node "shared" (split or not).
    assert submit(alice, vision, gpu_models=["A100-80GB"], gpu_count=2).state == JobState.QUEUED
    Gpu.objects.filter(uuid="GPU-shared-1").update(mig_mode=True)
    with pytest.raises(ValidationFailed, match="No node has 2"):  # (another key of the short-lived size cache)
        submit(alice, vision, gpu_models=["A100-80GB", "A30-24GB"], gpu_count=2)


def test_a_share_booked_between_the_snapshot_and_the_start_wins_and_the_job_stays_queued(alice, vision, ready, sent):
    """The allocation constraint on each share is the last guard: a quarter booked after the pass read the fleet
    makes the whole-GPU start on that GPU fail, with nothing of it written."""
    from apps.jobs.scheduler.apply import apply_decisions
    from apps.jobs.scheduler.snapshot import epoch, load_snapshot
    from apps.jobs.scheduling import schedule

    exclusive_gpus_lost()
    whole = submit(alice, vision)
    now = timezone.now()
    ctx = load_snapshot(now)
    decisions = schedule(ctx.snapshot, policy=FAIR, now=epoch(now))
    assert [s.job_id for s in decisions.starts] == [str(whole.pk)]
    this_slot = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 15)
    reservation_create(user=alice, team=vision, start=this_slot, end=this_slot + timedelta(hours=1), gpu_share="0.25")
    result = apply_decisions(ctx, decisions, token=1, leader="test")
    assert result.started == [] and result.refused == {whole.pk: "conflict"}
    assert Job.objects.get(pk=whole.pk).state == JobState.QUEUED
    assert not Allocation.objects.filter(job_id=whole.pk).exists()
    assert not Job.gpus.through.objects.filter(job_id=whole.pk).exists()


def _pass_in_pieces(now: Any) -> tuple[Any, Any]:
    from apps.jobs.scheduler.snapshot import epoch, load_snapshot
    from apps.jobs.scheduling import schedule

    ctx = load_snapshot(now)
    return ctx, schedule(ctx.snapshot, policy=FAIR, now=epoch(now))


@pytest.mark.parametrize("split_to", [2, 1])
def test_a_split_changed_between_the_snapshot_and_the_start_starts_nothing_on_the_old_layout(
    alice, vision, ready, sent, split_to
):
    """An admin splits the GPU a pass chose (an exclusive one in 2, or the split one back to exclusive) after the
    pass read the fleet: the pass starts nothing, and the next one places the job on the GPU as it is now."""
    from apps.booking.services import gpu_shares_change
    from apps.jobs.scheduler.apply import apply_decisions

    exclusive_gpus_lost()
    target = "GPU-shared-0"
    if split_to == 2:  # the pass is to take an exclusive GPU whole: make GPU-shared-0's sister the only one left
        gpu_shares_change(actor=None, gpu_uuid="GPU-shared-0", shares=1)
        Gpu.objects.filter(uuid="GPU-shared-0").update(status=GpuStatus.LOST)
        Gpu.objects.filter(uuid="GPU-shared-1").update(status=GpuStatus.OK)
        target = "GPU-shared-1"
    whole = submit(alice, vision)
    now = timezone.now()
    ctx, decisions = _pass_in_pieces(now)
    assert [s.job_id for s in decisions.starts] == [str(whole.pk)]
    gpu_shares_change(actor=None, gpu_uuid=target, shares=split_to)
    result = apply_decisions(ctx, decisions, token=1, leader="test")
    assert result.started == []
    assert not Allocation.objects.filter(job_id=whole.pk).exists()
    assert Job.objects.get(pk=whole.pk).state == JobState.QUEUED
    one_pass()
    gpus = held_by(Job.objects.get(pk=whole.pk))
    if split_to == 2:  # all the new shares, none of the GPU itself
        assert sorted(g.uuid for g in gpus) == [f"{target}/share-0", f"{target}/share-1"]
    else:  # the GPU itself, no share
        assert [g.uuid for g in gpus] == [target]
    assert all(g.retired_at is None for g in gpus)


@pytest.mark.django_db(transaction=True)
def test_a_change_waits_for_a_pass_writing_its_starts_and_is_refused(alice, vision, ready, sent):
    """The other order: a pass is writing its starts (its transaction holds the scheduler's row) when the change
    comes; the change waits for it, then finds the job's allocations and is refused."""
    import threading

    from django.db import connection, transaction

    from apps.booking.services import gpu_shares_change
    from apps.jobs.scheduler.apply import apply_decisions

    exclusive_gpus_lost()
    whole = submit(alice, vision)
    outcome: dict[str, str] = {}

    def change() -> None:
        try:
            gpu_shares_change(actor=None, gpu_uuid="GPU-shared-0", shares=2)
            outcome["change"] = "applied"
        except Conflict:
            outcome["change"] = "refused"
        finally:
            connection.close()

    changer = threading.Thread(target=change)
    with transaction.atomic():  # the pass's write transaction, kept open while the change comes
        ctx, decisions = _pass_in_pieces(timezone.now())
        assert apply_decisions(ctx, decisions, token=1, leader="test").started == [whole.pk]
        changer.start()
        changer.join(timeout=2)
        assert changer.is_alive()  # waiting for the pass's transaction
    changer.join(timeout=30)
    assert outcome == {"change": "refused"}
    assert shares_of_split(Job.objects.get(pk=whole.pk)) == {"GPU-shared-0"}
    assert Gpu.objects.get(uuid="GPU-shared-0").shares == 4
