"""Jobs on parts of GPUs: submitted with mig_profile or gpu_share, started by the scheduler's pass on exactly such a
part (never on a whole GPU), the launch naming the MIG instance or the shared GPU with the share and its memory;
a whole-GPU job never lands on a MIG-mode GPU, nor on a shared one while a queued job asks for a share
(test_whole_on_split.py has when it does); bad parts are 400."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Allocation
from apps.booking.services import allocations_end_of_job, reservation_create
from apps.core.errors import ValidationFailed
from apps.fleet.models import Gpu
from apps.jobs import scheduler, services
from apps.jobs.models import Job, JobState
from apps.jobs.scheduling import FAIR
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


def submit(user: Any, team: Any, **fields: Any) -> Job:
    return services.job_submit(
        user=user, team=team, image="portal-test/busybox:latest", command=["true"], max_duration_s=600, **fields
    )


def one_pass() -> scheduler.PassResult:
    return scheduler.run_pass(token=1, leader="test", policy=FAIR)


def test_share_and_mig_jobs_start_on_their_parts(alice, vision, ready, sent, django_capture_on_commit_callbacks):
    quarter = submit(alice, vision, gpu_share=0.25)
    mig = submit(alice, vision, mig_profile="1g.10gb")
    whole = [submit(alice, vision) for _ in range(3)]  # two exclusive GPUs exist
    with django_capture_on_commit_callbacks(execute=True):
        result = one_pass()
    assert quarter.pk in result.started and mig.pk in result.started
    assert len([j for j in whole if j.pk in result.started]) == 2
    held = {a.job_id: a.gpu for a in Allocation.objects.filter(active=True).select_related("gpu")}
    assert held[quarter.pk].kind == "share" and held[quarter.pk].parent_id == ready["shared"].pk
    assert held[mig.pk].kind == "mig" and held[mig.pk].mig_profile == "1g.10gb"
    assert {held[j.pk].uuid for j in whole if j.pk in held} == {"GPU-mig-1", "GPU-shared-1"}
    launches = {body["job_id"]: body for body in sent}
    assert launches[quarter.pk]["gpu_uuids"] == ["GPU-shared-0"]
    assert launches[quarter.pk]["gpu_share"] == 0.25
    assert launches[quarter.pk]["gpu_memory_mib"] == 81920 // 4
    assert launches[mig.pk]["gpu_uuids"] == [held[mig.pk].uuid]
    assert "gpu_share" not in launches[mig.pk]
    assert Job.objects.get(pk=quarter.pk).state == JobState.STARTING
    assert Job.objects.get(pk=quarter.pk).hourly_price == ready["model"].hourly_price / 4


def test_a_mig_jobs_cost_so_far_uses_the_admins_price_of_its_profile(alice, vision, ready, sent):
    from apps.billing.models import MigProfilePrice

    MigProfilePrice.objects.create(gpu_model=ready["model"], profile="1g.10gb", hourly_price=Decimal("0.55"))
    priced = submit(alice, vision, mig_profile="1g.10gb")
    assert priced.pk in one_pass().started
    # As the ledger will bill it (tests/sharing/test_billing.py), not the GPU's price x 1/7.
    assert Job.objects.get(pk=priced.pk).hourly_price == Decimal("0.55")


def test_five_quarters_on_four_shares(alice, vision, ready, sent):
    jobs = [submit(alice, vision, gpu_share=0.25) for _ in range(5)]
    result = one_pass()
    assert len([j for j in jobs if j.pk in result.started]) == 4
    assert Allocation.objects.filter(active=True, gpu__kind="share").count() == 4
    # A later pass after one ends starts the fifth.
    allocations_end_of_job(job_id=jobs[0].pk, at=timezone.now())
    assert jobs[4].pk in one_pass().started


@pytest.mark.parametrize(
    "fields",
    [
        {"mig_profile": "9g.99gb"},
        {"gpu_share": 0},
        {"gpu_share": 2},
        {"gpu_share": 0.25, "gpu_count": 2},
        {"gpu_share": 0.25, "mig_profile": "1g.10gb"},
    ],
)
def test_bad_parts_are_refused(alice, vision, ready, fields):
    with pytest.raises(ValidationFailed):
        submit(alice, vision, **fields)


def test_api_submission(api_as, alice, ready):
    resp = api_as(alice).post(
        "/api/v1/jobs/",
        {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], "gpu_share": 0.25},
        format="json",
    )
    assert resp.status_code == 201, resp.json()
    assert resp.json()["gpu_share"] == 0.25 and resp.json()["mig_profile"] is None
    bad = api_as(alice).post(
        "/api/v1/jobs/",
        {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], "mig_profile": "2g.99gb"},
        format="json",
    )
    assert bad.status_code == 400 and "mig_profile" in bad.json()["fields"]


@pytest.mark.parametrize(
    ("fields", "field", "detail"),
    [
        # A profile NVIDIA defines, but no instance of the fleet has it (the MIG GPU is laid out in 1g.10gb).
        (
            {"mig_profile": "3g.40gb"},
            "mig_profile",
            "No MIG instance of profile '3g.40gb' in the fleet (instances: 1g.10gb).",
        ),
        # The shared GPU is split in 4: 0.3 is not a whole number of its shares.
        (
            {"gpu_share": 0.3},
            "gpu_share",
            "No GPU is split so that 0.3 of it is a whole number of shares (splits: 1/4).",
        ),
    ],
)
def test_a_part_the_fleets_layout_cannot_give_is_400_not_a_job_that_waits_forever(
    api_as, alice, ready, fields, field, detail
):
    body = {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], **fields}
    resp = api_as(alice).post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["code"] == "invalid"
    assert resp.json()["detail"] == detail
    assert field in resp.json()["fields"]
    assert not Job.objects.exists()
    # Once the layout gives it, the same request is a job.
    if field == "gpu_share":
        Gpu.objects.filter(uuid="GPU-shared-1").update(shares=10)
    else:
        instance = Gpu.devices.filter(kind="mig").order_by("pk").first()
        assert instance is not None
        Gpu.devices.filter(pk=instance.pk).update(mig_profile="3g.40gb")
    assert api_as(alice).post("/api/v1/jobs/", body, format="json").status_code == 201


def test_a_part_of_a_model_not_laid_out_for_it_is_400(api_as, alice, ready):
    from tests.factories import GpuFactory, GpuModelFactory

    h100 = GpuModelFactory(name="H100-80GB")
    GpuFactory(node=ready["shared"].node, index=2, model=h100, uuid="GPU-h100-0")
    body = {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], "gpu_model": "H100-80GB"}
    share = api_as(alice).post("/api/v1/jobs/", {**body, "gpu_share": 0.25}, format="json")
    assert share.status_code == 400
    assert share.json()["detail"].startswith("No GPU of model H100-80GB is split in shares")
    mig = api_as(alice).post("/api/v1/jobs/", {**body, "mig_profile": "1g.10gb"}, format="json")
    assert mig.status_code == 400
    assert mig.json()["detail"] == "No MIG instance of profile '1g.10gb' of model H100-80GB (no GPU in MIG mode)."
    assert not Job.objects.exists()


def test_a_share_with_no_split_gpu_in_the_fleet_is_400(api_as, alice, ready):
    Gpu.objects.filter(parent__isnull=True).update(shares=1)
    body = {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], "gpu_share": 0.5}
    resp = api_as(alice).post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 400 and resp.json()["fields"]["gpu_share"] == ["No GPU in the fleet is split in shares."]
    # A share of 1 is a whole GPU: no split needed.
    assert api_as(alice).post("/api/v1/jobs/", {**body, "gpu_share": 1}, format="json").status_code == 201


def test_the_submit_form_offers_the_fleets_parts_and_queues_a_job_on_one(client, alice, ready):
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    # The parts the fleet is laid out in: the seven 1g.10gb instances and the GPU split in 4.
    for value, label in (
        ("mig:1g.10gb", "MIG instance 1g.10gb"),
        ("share:0.25", "0.25 of a shared GPU (no memory isolation)"),
        ("share:0.5", "0.5 of a shared GPU"),
    ):
        assert f'value="{value}"' in page and label in page
    form = {
        "team": "vision", "name": "", "image": "portal-test/busybox:latest", "command": "true", "env": "",
        "gpu_count": "1", "gpu_model": "", "cpus": "1", "memory_mib": "1024", "max_duration_s": "60", "priority": "0",
    }  # fmt: skip

    # A part is one GPU's: two GPUs of it is an inline error, and nothing is queued.
    bad = client.post("/jobs/new/", {**form, "gpu_count": "2", "part": "share:0.25"})
    assert bad.status_code == 200 and 'id="error-gpu_count"' in bad.content.decode()
    # A part the fleet is not laid out in (an edited form) is the form's own error.
    assert 'id="error-part"' in client.post("/jobs/new/", {**form, "part": "share:0.3"}).content.decode()
    assert not Job.objects.exists()

    quarter = client.post("/jobs/new/", {**form, "part": "share:0.25"})
    mig = client.post("/jobs/new/", {**form, "part": "mig:1g.10gb"})
    whole = client.post("/jobs/new/", form)
    assert quarter.status_code == mig.status_code == whole.status_code == 302
    jobs = list(Job.objects.order_by("pk").values_list("gpu_share", "mig_profile"))
    assert jobs == [(Decimal("0.25"), ""), (None, "1g.10gb"), (None, "")]


def test_job_page_says_what_a_share_means(client, alice, vision, ready):
    job = submit(alice, vision, gpu_share=0.25)
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "0.25 of one GPU: shared, no memory isolation" in page
    mig = submit(alice, vision, mig_profile="1g.10gb")
    assert "a MIG instance 1g.10gb" in client.get(f"/jobs/{mig.pk}/").content.decode()


def test_a_part_on_a_slurm_pools_gpu_is_not_taken_and_leaves_no_allocation(alice, vision, ready, sent):
    from apps.fleet.models import Pool, PoolBackend

    pool = Pool.objects.create(name="cluster", backend=PoolBackend.SLURM)
    shared = [g for g in Gpu.objects.select_related("node") if g.shares > 1]
    assert shared, "the sharing fleet has a shared GPU"
    for gpu in shared:
        gpu.node.pool = pool
        gpu.node.save(update_fields=["pool"])
    quarter = submit(alice, vision, gpu_share=0.25)
    result = one_pass()
    assert quarter.pk not in result.started
    quarter.refresh_from_db()
    assert quarter.state == JobState.QUEUED
    assert not Allocation.objects.filter(job_id=quarter.pk).exists()


def test_jobs_on_parts_start_in_the_policys_order_not_in_arrival_order(alice, vision, ready, sent):
    """The last free share goes to the job the fair order puts first (here: higher priority), as on whole GPUs."""
    held = [submit(alice, vision, gpu_share=0.25) for _ in range(3)]
    assert set(one_pass().started) >= {j.pk for j in held}
    early = submit(alice, vision, gpu_share=0.25)
    urgent = submit(alice, vision, gpu_share=0.25, priority=5)
    started = one_pass().started
    assert urgent.pk in started and early.pk not in started
    assert Job.objects.get(pk=early.pk).state == JobState.QUEUED


def _pass_at(now: Any) -> scheduler.PassResult:
    return scheduler.run_pass(token=1, leader="test", policy=FAIR, now=now)


def test_jobs_in_a_reservation_of_an_instance_run_on_it_one_at_a_time(
    alice, vision, ready, sent, django_capture_on_commit_callbacks
):
    start, end = slot(hours=2)
    booked = reservation_create(user=alice, team=vision, start=start, end=end, mig_profile="1g.10gb", gpu_count=1)
    instance = booked.reservation.allocations.get().gpu
    first = submit(alice, vision, reservation_id=booked.reservation.pk)  # names no part: the reservation's
    second = submit(alice, vision, reservation_id=booked.reservation.pk, mig_profile="1g.10gb")
    assert (first.mig_profile, first.gpu_share) == ("1g.10gb", None)

    assert _pass_at(start - timedelta(minutes=5)).started == []  # not before the window
    first.refresh_from_db()
    assert (first.pending_reason, first.pending_message) == (
        "reservation_not_started",
        f"reservation {booked.reservation.pk} starts in 5 min",
    )
    with django_capture_on_commit_callbacks(execute=True):
        started = _pass_at(start + timedelta(minutes=1)).started
    assert started == [first.pk]
    assert list(Job.gpus.through.objects.filter(job_id=first.pk).values_list("gpu_id", flat=True)) == [instance.pk]
    assert not Allocation.objects.filter(job_id=first.pk).exists()  # the reservation's allocation holds it
    assert next(b for b in sent if b["job_id"] == first.pk)["gpu_uuids"] == [instance.uuid]
    # One instance, one job: the second waits for it, then runs on it.
    assert second.pk not in _pass_at(start + timedelta(minutes=2)).started
    second.refresh_from_db()
    assert second.pending_reason == "waiting_for_reserved_gpus"
    assert second.pending_message == (
        f"waiting for a 1g.10gb MIG instance of reservation {booked.reservation.pk} (in use by job {first.pk})"
    )
    Job.objects.filter(pk=first.pk).update(state=JobState.SUCCEEDED)
    assert _pass_at(start + timedelta(minutes=3)).started == [second.pk]


def test_a_job_in_a_reservation_must_ask_for_what_it_holds(alice, vision, ready):
    start, end = slot(hours=2)
    quarter = reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.25").reservation
    job = submit(alice, vision, reservation_id=quarter.pk, gpu_share=0.25)
    assert job.gpu_share == Decimal("0.25")
    whole = reservation_create(user=alice, team=vision, start=start, end=end, gpu_model="A100-80GB", gpu_count=1)
    refusals = [
        ({"reservation_id": quarter.pk, "gpu_share": 0.5}, "reservation"),
        ({"reservation_id": quarter.pk, "mig_profile": "1g.10gb"}, "reservation"),
        ({"reservation_id": quarter.pk, "gpu_count": 2}, "gpu_count"),
        ({"reservation_id": whole.reservation.pk, "gpu_share": 0.25}, "reservation"),
    ]
    for fields, field in refusals:
        with pytest.raises(ValidationFailed) as refused:
            submit(alice, vision, **fields)
        assert field in (refused.value.fields or {}), (fields, refused.value.fields)


def test_a_half_gpu_reservation_runs_a_half_or_two_quarters(
    alice, vision, ready, sent, django_capture_on_commit_callbacks
):
    """A reservation of 0.5 of a GPU split in 4 holds two shares: a job naming no part gets both, and quarter jobs
    run side by side; 0.75 is more than it holds."""
    start, end = slot(hours=2)
    half = reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.5").reservation
    assert half.allocations.count() == 2
    inferred = submit(alice, vision, reservation_id=half.pk)
    assert inferred.gpu_share == Decimal("0.5")
    with pytest.raises(ValidationFailed) as refused:
        submit(alice, vision, reservation_id=half.pk, gpu_share=0.75)
    assert "0.5 of one GPU" in str(refused.value.detail)

    with django_capture_on_commit_callbacks(execute=True):
        assert _pass_at(start + timedelta(minutes=1)).started == [inferred.pk]
    launch = next(b for b in sent if b["job_id"] == inferred.pk)
    assert launch["gpu_uuids"] == ["GPU-shared-0"] and launch["gpu_share"] == 0.5
    assert launch["gpu_memory_mib"] == 81920 // 2
    quarters = [submit(alice, vision, reservation_id=half.pk, gpu_share=0.25) for _ in range(2)]
    assert _pass_at(start + timedelta(minutes=2)).started == []  # the half holds both shares
    Job.objects.filter(pk=inferred.pk).update(state=JobState.SUCCEEDED)
    assert sorted(_pass_at(start + timedelta(minutes=3)).started) == sorted(j.pk for j in quarters)
    held = {gpu for job in quarters for gpu in Job.gpus.through.objects.filter(job_id=job.pk).values_list("gpu_id")}
    assert len(held) == 2  # one share each
