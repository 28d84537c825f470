"""job_submit: what it queues, and everything it refuses (nothing queued on a refusal)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.booking.models import QuotaHold, Reservation
from apps.core.errors import ApplicationError, Forbidden, NotFound, ValidationFailed
from apps.jobs.models import Job, JobEvent, JobState, TeamJobPolicy

pytestmark = pytest.mark.django_db


def test_submit_queues_the_job_with_an_event_and_a_quota_hold(alice, vision, submit):
    job = submit(alice, vision, command=["python", "train.py"], gpu_count=2, gpu_model="A100-80GB", name="t1")

    assert job.state == JobState.QUEUED
    assert job.gpu_models == ["A100-80GB"]
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True)) == ["queued"]
    hold = QuotaHold.objects.get(job_id=job.pk)
    assert hold.gpu_count == 2 and hold.active


def test_same_idempotency_key_returns_the_first_job(alice, vision, submit):
    first = submit(alice, vision, idempotency_key="ci-123")
    second = submit(alice, vision, idempotency_key="ci-123")
    assert first.pk == second.pk
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("fields", "error", "code"),
    [
        ({"command": "python train.py"}, ValidationFailed, "invalid"),
        ({"image": "evil/miner:latest"}, ValidationFailed, "image_not_allowed"),
        ({"gpu_count": 5, "gpu_model": "A100-80GB"}, ValidationFailed, "invalid"),
        ({"gpu_count": 9}, ValidationFailed, "invalid"),
        ({"gpu_count": 0}, ValidationFailed, "invalid"),
        ({"gpu_model": "V100"}, ValidationFailed, "invalid"),
        ({"max_duration_s": 30 * 24 * 3600}, ValidationFailed, "invalid"),
        ({"priority": 11}, ValidationFailed, "invalid"),
        ({"env": {"1BAD": "x"}}, ValidationFailed, "invalid"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ValidationFailed, "invalid"),
        ({"env": {"OK": 3}}, ValidationFailed, "invalid"),
        ({"env": {"BIG": "x" * 20000}}, ValidationFailed, "invalid"),
        ({"options": {"privileged": True}}, Forbidden, "policy_violation"),
        ({"options": {"cap_add": ["SYS_ADMIN"]}}, Forbidden, "policy_violation"),
        ({"options": {"devices": ["/dev/nvidia0"]}}, Forbidden, "policy_violation"),
        ({"options": {"pid_mode": "host"}}, Forbidden, "policy_violation"),
        ({"network": "host"}, Forbidden, "policy_violation"),
        ({"mounts": [{"host_path": "/etc", "container_path": "/etc"}]}, Forbidden, "policy_violation"),
        (
            {"mounts": [{"host_path": "/srv/datasets", "container_path": "/data", "read_only": False}]},
            Forbidden,
            "policy_violation",
        ),
        ({"cpus": 0}, ValidationFailed, "invalid"),
        ({"memory_mib": 1}, ValidationFailed, "invalid"),
    ],
)
def test_bad_requests_are_refused_and_nothing_is_queued(alice, vision, submit, fields, error, code):
    with pytest.raises(error) as caught:
        submit(alice, vision, **fields)
    assert caught.value.code == code
    assert Job.objects.count() == 0
    assert QuotaHold.objects.count() == 0


def test_shell_string_message_is_the_documented_one(alice, vision, submit):
    with pytest.raises(ValidationFailed) as caught:
        submit(alice, vision, command="echo hi && rm -rf /")
    assert caught.value.detail == "command must be a list of arguments"


def test_listed_mount_is_accepted(alice, vision, submit):
    job = submit(alice, vision, mounts=[{"host_path": "/srv/datasets", "container_path": "/data"}])
    assert job.mounts == [{"host_path": "/srv/datasets", "container_path": "/data", "read_only": True}]


def test_outsider_cannot_submit_for_a_team(charlie, vision, submit):
    with pytest.raises(Forbidden):
        submit(charlie, vision)
    assert Job.objects.count() == 0


def test_team_policy_raises_the_priority_allowance_and_staff_go_higher(alice, admin, vision, submit):
    TeamJobPolicy.objects.create(team=vision, max_priority=50)
    assert submit(alice, vision, priority=50).priority == 50
    assert submit(admin, vision, priority=90).priority == 90
    with pytest.raises(ValidationFailed):
        submit(alice, vision, priority=51)


def _reservation(team, user, fleet, hours=2):
    now = timezone.now()
    return Reservation.objects.create(
        team=team,
        user=user,
        gpu_model=fleet["a100"],
        gpu_count=2,
        start=now - timedelta(minutes=5),
        end=now + timedelta(hours=hours),
        booked_end=now + timedelta(hours=hours),
        status="active",
    )


def test_job_in_own_reservation_is_queued_without_a_quota_hold(alice, vision, fleet, submit):
    resv = _reservation(vision, alice, fleet)
    job = submit(alice, vision, reservation_id=resv.pk, gpu_count=2)
    assert job.reservation_id == resv.pk
    assert not QuotaHold.objects.filter(job_id=job.pk).exists()


def test_someone_elses_reservation_is_refused(alice, charlie, nlp, vision, fleet, submit):
    theirs = _reservation(nlp, charlie, fleet)
    with pytest.raises(NotFound):
        submit(alice, vision, reservation_id=theirs.pk)
    assert Job.objects.count() == 0


def test_reservation_of_another_of_my_teams_is_refused(alice, nlp, vision, fleet, submit):
    from tests.factories import MembershipFactory

    MembershipFactory(user=alice, team=nlp)
    alice._portal_team_ids = None
    theirs = _reservation(nlp, alice, fleet)
    with pytest.raises(Forbidden):
        submit(alice, vision, reservation_id=theirs.pk)


def test_max_duration_must_fit_the_reservation(alice, vision, fleet, submit):
    resv = _reservation(vision, alice, fleet, hours=1)
    with pytest.raises(ApplicationError):
        submit(alice, vision, reservation_id=resv.pk, max_duration_s=4 * 3600)


def test_a_too_large_job_is_refused_on_fresh_numbers_not_a_remembered_fleet(alice, vision, fleet, submit):
    """The largest node's size is remembered for a few seconds to accept jobs, never to refuse one."""
    from tests.factories import GpuFactory, NodeFactory

    submit(alice, vision, gpu_count=2)  # remembers: the largest node has 8 GPUs
    with pytest.raises(ValidationFailed):
        submit(alice, vision, gpu_count=12)
    node = NodeFactory(name="node03", last_heartbeat=timezone.now())
    for i in range(16):
        GpuFactory(node=node, index=i, model=fleet["h100"], uuid=f"GPU-big-{i:04d}")
    assert submit(alice, vision, gpu_count=12).state == JobState.QUEUED


def test_an_unlimited_teams_usage_is_counted_at_submit_and_settled_at_the_end(alice, vision, submit):
    """Without any limit the hold skips the usage row lock (nothing to check), but the month's usage still counts
    the job's max duration while queued and its real runtime once it ended; a missing usage row is created."""
    from decimal import Decimal

    from apps.booking.models import QuotaUsage
    from apps.jobs import services

    assert not QuotaUsage.objects.filter(team=vision).exists()
    job = submit(alice, vision, gpu_count=2, gpu_model="A100-80GB", max_duration_s=3600)
    usage = QuotaUsage.objects.get(team=vision)
    assert usage.gpu_hours == Decimal("2.0000") and usage.cost == Decimal("5.0000")  # 2 GPUs x 1 h x 2.5/h
    job = services.job_cancel(job=job, user=alice)  # never ran: everything given back
    usage.refresh_from_db()
    assert usage.gpu_hours == 0 and usage.cost == 0
    assert not QuotaHold.objects.get(job_id=job.pk).active


def test_a_team_at_its_queue_limit_is_refused_with_429_and_nothing_is_queued(alice, vision, submit):
    TeamJobPolicy.objects.create(team=vision, max_queued_jobs=2)
    submit(alice, vision)
    submit(alice, vision)
    with pytest.raises(ApplicationError) as caught:
        submit(alice, vision)
    assert (caught.value.code, caught.value.status) == ("too_many_queued", 429)
    assert "2 queued jobs (at most 2)" in caught.value.detail
    assert Job.objects.filter(team=vision).count() == 2
    assert QuotaHold.objects.count() == 2
    # A job that leaves the queue makes room again.
    from apps.jobs import services

    services.job_cancel(job=Job.objects.filter(team=vision).first(), user=alice)
    assert submit(alice, vision).state == JobState.QUEUED


def test_submission_facts_read_policy_image_and_queue_in_one_query(
    alice, vision, nlp, submit, django_assert_num_queries
):
    from apps.jobs.models import ContainerImage
    from apps.jobs.selectors import submission_facts
    from tests.jobs.conftest import BUSYBOX

    submit(alice, vision)
    with django_assert_num_queries(1):
        facts = submission_facts(team_id=vision.pk, image=BUSYBOX)
    assert facts.policy is None and facts.queued == 1
    assert facts.image is not None and facts.image.name == BUSYBOX
    assert facts.image.allowed_mounts == [{"host_path": "/srv/datasets", "container_path": "/data", "read_only": True}]

    TeamJobPolicy.objects.create(team=vision, max_priority=50, max_queued_jobs=7)
    ContainerImage.objects.filter(name=BUSYBOX).update(enabled=False)
    facts = submission_facts(team_id=vision.pk, image=BUSYBOX)
    assert facts.policy is not None and (facts.policy.max_priority, facts.policy.max_queued_jobs) == (50, 7)
    assert facts.image is None  # disabled: not on the allow-list
    assert submission_facts(team_id=nlp.pk, image="nope").queued == 0
    with pytest.raises(ValidationFailed) as caught:
        submit(alice, vision)
    assert caught.value.code == "image_not_allowed"
