"""The ORM shell around the pure core: snapshot, one pass applied in one transaction, fencing, leadership."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Allocation, Reservation
from apps.fleet.models import NodeStatus
from apps.jobs import conf, scheduler
from apps.jobs.models import Job, JobState, SchedulerState
from apps.jobs.scheduling import FAIR, FIFO


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Commands the portal sends to agents (after commit), recorded instead of going to Redis."""
    from apps.fleet import commands

    out: list[dict[str, Any]] = []

    def record(queue: str, task: str, envelope: dict[str, Any], **kwargs: Any) -> None:
        out.append({"task": task, "queue": queue, "body": envelope["body"], "envelope": envelope})

    monkeypatch.setattr(commands, "publish_command", record)
    return out


def one_pass(token: int = 1, **kwargs: Any) -> scheduler.PassResult:
    return scheduler.run_pass(token=token, leader="test", policy=kwargs.pop("policy", FAIR), **kwargs)


@pytest.mark.django_db
def test_a_pass_starts_a_queued_job_and_sends_the_launch_after_commit(
    alice, vision, submit, sent, django_capture_on_commit_callbacks
):
    job = submit(alice, vision, gpu_count=2, gpu_model="A100-80GB", env={"A": "1"})
    with django_capture_on_commit_callbacks(execute=True):
        result = one_pass()
    assert result.started == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.node.name == "node01"
    assert job.gpus.count() == 2
    assert Allocation.objects.filter(job_id=job.pk, kind="job", active=True).count() == 2
    assert len(sent) == 1
    launch = sent[0]
    assert launch["task"] == "agent.launch_job" and launch["queue"] == "node.node01"
    body = launch["body"]
    assert body["job_id"] == job.pk and body["command"] == ["echo", "hi"] and body["env"] == {"A": "1"}
    assert sorted(body["gpu_uuids"]) == sorted(g.uuid for g in job.gpus.all())
    assert launch["envelope"]["sig"]  # signed for the node


@pytest.mark.django_db
def test_a_pass_starts_many_jobs_in_one_batch_each_as_one_start_would(
    alice, vision, submit, sent, django_capture_on_commit_callbacks, monkeypatch
):
    from apps.jobs.models import JobEvent
    from apps.jobs.services import starting

    jobs = [submit(alice, vision, gpu_count=n) for n in (1, 2, 1, 3)]

    def one_at_a_time(**kwargs: Any) -> None:
        raise AssertionError("the batch should have started them all")

    monkeypatch.setattr(starting, "job_start", one_at_a_time)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        result = one_pass()
    assert sorted(result.started) == sorted(j.pk for j in jobs) and not result.refused
    assert sorted(m["body"]["job_id"] for m in sent) == sorted(j.pk for j in jobs)
    held: set[int] = set()
    for job in jobs:
        job.refresh_from_db()
        gpus = {g.pk for g in job.gpus.all()}
        assert job.state == JobState.STARTING and job.node is not None and len(gpus) == job.gpu_count
        assert {g.node_id for g in job.gpus.all()} == {job.node_id}  # gang: one node
        assert job.scheduled_at is not None and job.launch_attempts == 1
        assert job.hourly_price == sum(g.model.hourly_price for g in job.gpus.all())
        allocations = Allocation.objects.filter(job_id=job.pk, kind="job", active=True)
        assert {a.gpu_id for a in allocations} == gpus and all(a.team_id == vision.pk for a in allocations)
        assert all(a.end - a.start == timedelta(seconds=600 + conf.ALLOCATION_SLACK_S) for a in allocations)
        assert list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state")) == [
            ("", "queued"),
            ("queued", "starting"),
        ]
        launch = next(m for m in sent if m["body"]["job_id"] == job.pk)
        assert launch["queue"] == f"node.{job.node.name}"
        assert sorted(launch["body"]["gpu_uuids"]) == sorted(g.uuid for g in job.gpus.all())
        assert not (held & gpus)
        held |= gpus
    assert len(callbacks) >= 2 * len(jobs)  # a launch and a websocket state message per job


@pytest.mark.django_db
def test_a_batch_tells_open_book_pages_once_per_team_over_its_longest_job(
    alice, charlie, vision, nlp, submit, sent, monkeypatch
):
    """Jobs outside reservations show on the Book timeline; a pass that starts many says so once per team
    (apps.booking.live), over the window its jobs hold, not once per job."""
    from apps.booking import live

    told: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(live.broadcast, "send_on_commit", lambda group, message: told.append((group, message)))
    submit(alice, vision, max_duration_s=600)
    submit(alice, vision, max_duration_s=1200)
    submit(charlie, nlp, max_duration_s=900)
    result = one_pass()
    assert len(result.started) == 3 and not result.refused
    by_team = {m["data"]["team_id"]: m for _, m in told}
    assert [g for g, _ in told] == ["bookings", "bookings"] and set(by_team) == {vision.pk, nlp.pk}
    for team, limit in ((vision, 1200), (nlp, 900)):
        data = by_team[team.pk]["data"]
        start, end = (timezone.datetime.fromisoformat(data[k]) for k in ("start", "end"))
        assert data["kind"] == "job" and end - start == timedelta(seconds=limit + conf.ALLOCATION_SLACK_S)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("count", [1, 3])
def test_a_pass_takes_one_savepoint_per_start_or_batch_and_no_nested_ones(alice, vision, submit, sent, count):
    """Each savepoint is two round trips; the pass's own (per start, or for the batch) is the one a refusal rolls
    back to, so the services inside add none (a pass starting one job used to take four)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    one_pass()  # the first pass creates the scheduler's and the policy's singleton rows (get_or_create savepoints)
    jobs = [submit(alice, vision, gpu_count=1) for _ in range(count)]
    with CaptureQueriesContext(connection) as queries:
        result = one_pass(token=2)
    assert sorted(result.started) == sorted(j.pk for j in jobs)
    savepoints = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SAVEPOINT")]
    assert len(savepoints) == 1


@pytest.mark.django_db
def test_a_batch_refused_in_part_starts_the_rest_one_by_one(alice, vision, fleet, submit, sent, monkeypatch):
    """Between the snapshot and the apply a GPU the pass chose gets taken and one job is cancelled: the batch is
    all or nothing, so the pass falls back to one start at a time; only those two stay queued."""
    from apps.booking import services as booking
    from apps.jobs import services
    from apps.jobs.scheduling import schedule
    from apps.jobs.services import starting

    jobs = [submit(alice, vision, gpu_count=1, gpu_model="A100-80GB") for _ in range(4)]
    now = timezone.now()
    ctx = scheduler.load_snapshot(now)
    decisions = schedule(ctx.snapshot, policy=FAIR, now=scheduler.epoch(now))
    chosen = {s.job_id: s.gpu_ids for s in decisions.starts}
    assert len(chosen) == 4
    taken_job, cancelled_job = jobs[0], jobs[1]
    booking.allocations_create(
        gpus=[int(chosen[str(taken_job.pk)][0])], team=vision, user=alice, kind="job", job_id=None,
        start=now - timedelta(seconds=1), end=now + timedelta(hours=1),
    )  # fmt: skip
    services.job_cancel(job=Job.objects.get(pk=cancelled_job.pk), user=alice)
    tried: list[int] = []
    batch = starting.jobs_start_many

    def spy(**kwargs: Any) -> list[int]:
        tried.append(len(kwargs["items"]))
        return batch(**kwargs)

    monkeypatch.setattr(starting, "jobs_start_many", spy)
    result = scheduler.apply_decisions(ctx, decisions, token=1, leader="test")
    assert tried == [4]
    assert sorted(result.started) == sorted([jobs[2].pk, jobs[3].pk])
    assert set(result.refused) == {taken_job.pk, cancelled_job.pk}
    taken_job.refresh_from_db()
    assert taken_job.state == JobState.QUEUED and taken_job.pending_reason == "conflict"
    assert Job.objects.get(pk=cancelled_job.pk).state == JobState.CANCELLED
    assert not Allocation.objects.filter(job_id__in=[taken_job.pk, cancelled_job.pk]).exists()
    for job in jobs[2:]:
        assert Job.objects.get(pk=job.pk).state == JobState.STARTING
        assert Allocation.objects.filter(job_id=job.pk, active=True).count() == 1


@pytest.mark.django_db
def test_nothing_is_sent_when_the_apply_transaction_rolls_back(alice, vision, submit, sent, monkeypatch):
    submit(alice, vision)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("crash after the starts")

    from apps.jobs.scheduler import apply

    monkeypatch.setattr(apply, "_store_reasons", boom)
    with pytest.raises(RuntimeError):
        one_pass()
    assert Job.objects.get().state == JobState.QUEUED
    assert not Allocation.objects.exists()
    assert sent == []


@pytest.mark.django_db
def test_a_second_pass_does_not_start_a_job_twice(alice, vision, submit, sent):
    job = submit(alice, vision)
    assert one_pass().started == [job.pk]
    assert one_pass().started == []
    assert Allocation.objects.filter(job_id=job.pk).count() == 1


@pytest.mark.django_db
def test_gang_goes_to_a_node_with_enough_gpus_and_models_are_respected(alice, vision, submit, sent):
    big = submit(alice, vision, gpu_count=6)
    a100 = submit(alice, vision, gpu_count=1, gpu_model="A100-80GB")
    one_pass()
    big.refresh_from_db()
    a100.refresh_from_db()
    assert big.node.name == "node02" and big.gpus.count() == 6
    assert a100.node.name == "node01"


@pytest.mark.django_db
def test_a_job_for_any_model_runs_only_on_models_the_teams_quota_allows(alice, vision, fleet, submit, sent):
    from apps.booking.models import Quota
    from apps.core.errors import Forbidden

    quota = Quota.objects.create(team=vision)
    quota.allowed_models.set([fleet["h100"]])
    # node01 (A100) is the best fit for one GPU, but the team may only use H100s.
    jobs = [submit(alice, vision, gpu_count=1) for _ in range(3)]
    assert all(job.gpu_models == ["H100-80GB"] for job in jobs)
    with pytest.raises(Forbidden) as refused:
        submit(alice, vision, gpu_count=1, gpu_model="A100-80GB")
    assert refused.value.code == "model_not_allowed"
    assert Job.objects.count() == 3
    assert sorted(one_pass().started) == sorted(job.pk for job in jobs)
    for job in jobs:
        job.refresh_from_db()
        assert job.node.name == "node02"
        assert {gpu.model.name for gpu in job.gpus.all()} == {"H100-80GB"}


@pytest.mark.django_db
def test_a_team_without_model_limits_keeps_any_model(alice, vision, submit, sent):
    job = submit(alice, vision, gpu_count=1)
    assert job.gpu_models == []
    one_pass()
    job.refresh_from_db()
    assert job.node.name == "node01"  # best fit: the smaller node


@pytest.mark.django_db
def test_queued_jobs_wait_with_a_reason_when_the_fleet_is_full(alice, vision, submit, sent):
    first = submit(alice, vision, gpu_count=8, gpu_model="H100-80GB")
    second = submit(alice, vision, gpu_count=8, gpu_model="H100-80GB")
    result = one_pass(policy=FIFO)
    assert result.started == [first.pk]
    second.refresh_from_db()
    assert second.state == JobState.QUEUED
    assert second.pending_reason == "waiting_for_gpus"
    assert "8 free GPU" in second.pending_message


@pytest.mark.django_db
def test_offline_and_draining_nodes_get_nothing(alice, vision, fleet, submit, sent):
    fleet["node01"].status = NodeStatus.OFFLINE
    fleet["node01"].save()
    fleet["node02"].draining = True
    fleet["node02"].save()
    job = submit(alice, vision)
    assert one_pass().started == []
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


@pytest.mark.django_db
def test_gpus_of_another_teams_active_reservation_are_not_used(alice, charlie, vision, nlp, fleet, submit, sent):
    from apps.booking import services as booking

    now = timezone.now()
    resv = Reservation.objects.create(
        team=nlp, user=charlie, gpu_count=4, start=now - timedelta(minutes=1), end=now + timedelta(hours=1),
        booked_end=now + timedelta(hours=1), status="active", gpu_model=fleet["a100"],
    )  # fmt: skip
    booking.allocations_create(
        gpus=fleet["gpus01"], team=nlp, user=charlie, start=resv.start, end=resv.end, kind="reservation",
        reservation=resv,
    )  # fmt: skip
    job = submit(alice, vision, gpu_model="A100-80GB")
    assert one_pass().started == []
    job.refresh_from_db()
    assert job.pending_reason in {"held_by_reservation", "waiting_for_gpus", "next_in_line"}

    # The reservation's own team runs inside it.
    theirs = submit(charlie, nlp, gpu_count=2, reservation_id=resv.pk, max_duration_s=600)
    assert one_pass().started == [theirs.pk]
    theirs.refresh_from_db()
    assert {g.pk for g in theirs.gpus.all()} <= {g.pk for g in fleet["gpus01"]}
    assert not Allocation.objects.filter(job_id=theirs.pk).exists()  # it runs on the reservation's rows


@pytest.mark.django_db
def test_a_job_that_would_run_into_maintenance_waits(alice, vision, fleet, submit, sent):
    from apps.booking.models import MaintenanceWindow

    now = timezone.now()
    MaintenanceWindow.objects.create(start=now + timedelta(minutes=5), end=now + timedelta(hours=1))
    long = submit(alice, vision, max_duration_s=3600)
    short = submit(alice, vision, max_duration_s=60)
    assert one_pass().started == [short.pk]
    long.refresh_from_db()
    assert long.state == JobState.QUEUED


@pytest.mark.django_db
def test_a_stale_leader_cannot_apply(alice, vision, submit, sent):
    submit(alice, vision)
    SchedulerState.objects.create(pk=1, fence=7)
    with pytest.raises(scheduler.NotLeader):
        one_pass(token=6)
    assert Job.objects.get().state == JobState.QUEUED
    assert one_pass(token=8).started


@pytest.mark.django_db
def test_a_running_job_of_an_ended_reservation_is_stopped_after_the_grace(
    alice, vision, fleet, submit, sent, django_capture_on_commit_callbacks
):
    from apps.booking.selectors import booking_policy
    from apps.jobs import services

    now = timezone.now()
    resv = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now - timedelta(hours=1), end=now + timedelta(minutes=30),
        booked_end=now + timedelta(minutes=30), status="active", gpu_model=fleet["a100"],
    )  # fmt: skip
    Allocation.objects.create(
        gpu=fleet["gpus01"][0], team=vision, kind="reservation", reservation=resv, start=resv.start, end=resv.end
    )
    job = submit(alice, vision, reservation_id=resv.pk, max_duration_s=600)
    one_pass()
    job.refresh_from_db()
    services.job_transition(job, JobState.RUNNING)
    grace = booking_policy().end_grace_minutes * 60

    Reservation.objects.filter(pk=resv.pk).update(end=now - timedelta(seconds=grace / 2), status="released")
    assert one_pass().stopped == []
    Reservation.objects.filter(pk=resv.pk).update(end=now - timedelta(seconds=grace + 1))
    with django_capture_on_commit_callbacks(execute=True):
        assert one_pass().stopped == [job.pk]
    job.refresh_from_db()
    assert job.stop_reason == "preempted"
    assert sent[-1]["task"] == "agent.cancel_job"


@pytest.mark.django_db
def test_an_overdue_job_the_node_did_not_stop_is_stopped_once(alice, vision, fleet, submit, sent):
    # The node kills a job at its deadline itself; a pass stops one that outlived it anyway (a node that missed it).
    from apps.jobs import conf, services

    job = submit(alice, vision, max_duration_s=60)
    one_pass()
    job.refresh_from_db()
    services.job_transition(job, JobState.RUNNING)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=60 + conf.CANCEL_GRACE_S + 5))
    assert one_pass().stopped == []  # within the node's own grace
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=60 + conf.CANCEL_GRACE_S + 30))
    assert one_pass().stopped == [job.pk]
    job.refresh_from_db()
    assert job.stop_reason == "timeout" and job.stop_requested_at is not None
    assert one_pass().stopped == []  # asked; asked again only after STOP_RESEND_S


class _Leader:
    token = 1

    def acquire(self) -> bool:
        return True

    def still_leader(self) -> bool:
        return True

    def release(self) -> None:
        pass


@pytest.mark.django_db
def test_the_leaders_pass_moves_reservations_at_their_start_and_end(
    alice, vision, fleet, sent, django_capture_on_commit_callbacks, monkeypatch
):
    """Not up to the beat's 15 s lifecycle tick later: the pass after the boundary activates and releases."""
    from apps.jobs.scheduler import loop as scheduler_loop

    monkeypatch.setattr(scheduler_loop, "close_old_connections", lambda: None)  # the test's transaction holds it
    now = timezone.now()
    starting = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now - timedelta(seconds=1), end=now + timedelta(hours=1),
        booked_end=now + timedelta(hours=1), status="booked", gpu_model=fleet["a100"],
    )  # fmt: skip
    ending = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now - timedelta(hours=1), end=now - timedelta(seconds=1),
        booked_end=now - timedelta(seconds=1), status="active", gpu_model=fleet["a100"],
    )  # fmt: skip
    later = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now + timedelta(hours=1), end=now + timedelta(hours=2),
        booked_end=now + timedelta(hours=2), status="booked", gpu_model=fleet["a100"],
    )  # fmt: skip
    loop = scheduler.SchedulerLoop(policy=FAIR, leadership=_Leader(), name="test", log=lambda _: None)
    with django_capture_on_commit_callbacks(execute=True):
        assert loop.step() is not None
    statuses = dict(Reservation.objects.values_list("pk", "status"))
    assert (statuses[starting.pk], statuses[ending.pk], statuses[later.pk]) == ("active", "released", "booked")


# --- Leadership -----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_postgres_advisory_lock_has_one_holder():
    first = scheduler.PostgresLeadership()
    second = scheduler.PostgresLeadership()
    try:
        assert first.acquire()
        assert not second.acquire()
        assert first.still_leader()
        scheduler.claim_fence(first.token, "first")  # the first leader applied a pass
        first.conn.close()  # the leader's connection dies: the server frees the lock once its backend exits
        deadline = time.monotonic() + 10
        while not second.acquire():
            assert time.monotonic() < deadline, "the lock was not freed"
            time.sleep(0.05)
        assert not first.still_leader()
        assert second.token > first.token
        scheduler.claim_fence(second.token, "second")
        with pytest.raises(scheduler.NotLeader):  # the old leader, paused until now, cannot apply any more
            scheduler.claim_fence(first.token, "first")
    finally:
        first.release()
        second.release()


@pytest.fixture
def latest_memory() -> Any:
    """Write GPUs' latest samples (memory used, age) where the ingest keeps them; removed afterwards."""
    import json

    from apps.core.redis import get_redis
    from apps.telemetry import keys

    r = get_redis()
    r.delete(keys.LATEST)

    def write(uuid: str, mem_used: int, age_s: float = 0.0) -> None:
        sample = {"uuid": uuid, "util": 0, "mem_used": mem_used, "mem_total": 81920, "ts": time.time() - age_s}
        r.hset(keys.LATEST, uuid, json.dumps(sample))

    yield write
    r.delete(keys.LATEST)


@pytest.mark.django_db
def test_a_job_goes_to_a_gpu_nothing_outside_the_portal_uses_while_there_is_one(
    alice, vision, submit, sent, latest_memory
):
    latest_memory("GPU-a100-0000", 20480)  # a process started by hand holds 20 GiB
    latest_memory("GPU-a100-0001", 30720)
    latest_memory("GPU-a100-0002", 30720, age_s=60)  # the node stopped reporting: says nothing about now
    latest_memory("GPU-a100-0003", 600)  # the driver's own
    jobs = [submit(alice, vision, gpu_model="A100-80GB") for _ in range(3)]
    assert one_pass(policy=FIFO).started == [j.pk for j in jobs]
    placed = [j.gpus.get().uuid for j in Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")]
    # Clean GPUs first, then the used ones: a preference, never a reason to leave a job queued.
    assert placed == ["GPU-a100-0002", "GPU-a100-0003", "GPU-a100-0000"]
    # The job that got one says so on its timeline; the others say nothing.
    messages = [j.events.get(to_state=JobState.STARTING).message for j in jobs]
    assert messages == [
        "",
        "",
        "memory in use outside the portal on node01/0 (20.0 GiB): no GPU free of such use fitted",
    ]

    # Started alone (not in a batch), the same.
    last = submit(alice, vision, gpu_model="A100-80GB")
    assert one_pass(policy=FIFO).started == [last.pk]
    assert last.gpus.get().uuid == "GPU-a100-0001"
    assert last.events.get(to_state=JobState.STARTING).message.startswith(
        "memory in use outside the portal on node01/1 (30.0 GiB)"
    )


@pytest.mark.django_db
def test_a_pass_places_jobs_when_redis_cannot_say_which_gpus_are_used(alice, vision, submit, sent, monkeypatch):
    import redis

    from apps.telemetry import selectors

    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # nothing listens on port 1
    monkeypatch.setattr(selectors, "get_request_redis", lambda: unreachable)
    job = submit(alice, vision, gpu_model="A100-80GB")
    assert one_pass().started == [job.pk]


@pytest.mark.django_db
def test_memory_left_from_what_the_portal_just_released_is_not_outside_use(
    alice, vision, fleet, submit, sent, latest_memory
):
    from apps.booking import services as booking

    now = timezone.now()
    # A booking of GPU 0 ended five seconds ago; its last samples still show what ran in it.
    resv = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now - timedelta(hours=1), end=now - timedelta(seconds=5),
        booked_end=now - timedelta(seconds=5), status="ended", gpu_model=fleet["a100"],
    )  # fmt: skip
    booking.allocations_create(
        gpus=fleet["gpus01"][:1], team=vision, user=alice, start=resv.start, end=resv.end, kind="reservation",
        reservation=resv,
    )  # fmt: skip
    latest_memory("GPU-a100-0000", 20480)
    latest_memory("GPU-a100-0001", 20480)  # this one nothing in the portal held
    job = submit(alice, vision, gpu_model="A100-80GB")
    assert one_pass(policy=FIFO).started == [job.pk]
    assert job.gpus.get().uuid == "GPU-a100-0000"
    assert job.events.get(to_state=JobState.STARTING).message == ""
