"""What nodes report (through the control-queue tasks) and what the portal repairs: started/exit/logs applied once
however often they arrive, logs bounded, forged reports refused, lost nodes and lost launches swept, inventories
reconciled, reservation ends stopping their jobs; quotas on submission and on start."""

from __future__ import annotations

import random
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.booking.models import Allocation, Quota
from apps.fleet import auth as fleet_auth
from apps.fleet import services as fleet
from apps.jobs import conf, scheduler, services, tasks
from apps.jobs.models import Job, JobEvent, JobLogLine, JobState
from apps.jobs.scheduling import FAIR

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from apps.fleet import commands

    out: list[dict[str, Any]] = []
    monkeypatch.setattr(commands, "publish_command", lambda queue, task, envelope, **kw: out.append(dict(envelope)))
    return out


def fleet_services_issue(name: str) -> tuple[Any, str]:
    node, token = fleet.node_token_issue(node_name=name)
    fleet_auth.forget(name)
    return node, token


def _running(submit: Any, user: Any, team: Any, fleet_rows: Any, **fields: Any) -> Job:
    job = submit(user, team, **fields)
    job = services.job_start(job=job, node=fleet_rows["node01"], gpus=fleet_rows["gpus01"][:1], now=timezone.now())
    return services.job_transition(job, JobState.RUNNING)


def test_reports_through_the_tasks_apply_once(alice, vision, fleet, submit, sent) -> None:
    _, token = fleet_services_issue("node01")
    job = submit(alice, vision)
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    env = {"node": "node01", "token": token, "ts": timezone.now().timestamp()}
    now = timezone.now().timestamp()

    assert tasks.report_started({**env, "job_id": job.pk, "handle": "abc", "at": now})
    assert tasks.report_started({**env, "job_id": job.pk, "handle": "abc", "at": now})  # a second copy: still running
    assert JobEvent.objects.filter(job=job, to_state="running").count() == 1
    batch = {"job_id": job.pk, "epoch": "e1", "first": 1, "lines": [["stdout", "a", now], ["stderr", "b", now]]}
    assert tasks.report_logs({**env, "batches": [batch]}) == 2
    assert tasks.report_logs({**env, "batches": [batch]}) == 0  # the broker delivered it twice
    more = {"job_id": job.pk, "epoch": "e1", "first": 2, "lines": [["stderr", "b", now], ["stdout", "c", now]]}
    assert tasks.report_logs({**env, "batches": [more]}) == 1  # overlapping: only the new line
    exit_body = {"job_id": job.pk, "state": "failed", "reason": "exit_code", "exit_code": 3, "message": "exited",
                 "finished_at": now + 1, "log_total": 3}  # fmt: skip
    assert tasks.report_exit({**env, **exit_body})
    assert not tasks.report_exit({**env, **exit_body})

    job.refresh_from_db()
    assert (job.state, job.reason, job.exit_code, job.handle) == ("failed", "exit_code", 3, "abc")
    assert job.logs_complete
    assert list(JobLogLine.objects.filter(job=job).values_list("seq", "stream", "line")) == [
        (1, "stdout", "a"),
        (2, "stderr", "b"),
        (3, "stdout", "c"),
    ]
    assert JobEvent.objects.filter(job=job, to_state="failed").count() == 1


def _lines(job: Job) -> list[tuple[int, str]]:
    return list(JobLogLine.objects.filter(job=job).order_by("seq").values_list("seq", "line"))


def test_log_batches_arriving_out_of_order_or_again_land_in_their_place(alice, vision, fleet, submit) -> None:
    """Two portal workers can take a job's batches in either order, and the agent sends recent batches again
    after a broker outage: each line lands once, in the agent's order (a late batch used to be dropped whole)."""
    job = _running(submit, alice, vision, fleet)
    node_id, now = fleet["node01"].pk, timezone.now()

    def append(epoch: str, first: int, *texts: str) -> int:
        lines = [services.LogLineIn("stdout", t, now) for t in texts]
        return services.job_logs_append(node_id=node_id, job_id=job.pk, epoch=epoch, first=first, lines=lines)

    assert append("e1", 3, "c", "d") == 2  # lines 1-2 are still on their way
    assert append("e1", 1, "a", "b") == 2  # ... and fill the gap when they come
    assert append("e1", 1, "a", "b", "c", "d", "e") == 1  # the replay after an outage: only "e" is new
    assert append("e1", 2, "b") == 0
    job.refresh_from_db()
    assert _lines(job) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
    assert (job.log_seq, job.log_agent_seq) == (5, 5)

    # An agent restart adopts the job: its numbering starts again at 1, after what is stored.
    assert append("e2", 2, "g") == 1
    assert append("e2", 1, "f") == 1
    assert append("e2", 1, "f", "g") == 0
    job.refresh_from_db()
    assert _lines(job)[5:] == [(6, "f"), (7, "g")]
    assert (job.log_seq, job.log_base, job.log_agent_seq) == (7, 5, 2)


def test_a_late_batch_older_than_the_kept_window_is_not_stored_again(alice, vision, fleet, submit, monkeypatch) -> None:
    monkeypatch.setattr(conf, "MAX_LOG_LINES", 100)
    job = _running(submit, alice, vision, fleet)
    node_id, now = fleet["node01"].pk, timezone.now()
    batch = [services.LogLineIn("stdout", f"line {i}", now) for i in range(1, 51)]
    services.job_logs_append(node_id=node_id, job_id=job.pk, epoch="e", first=1, lines=batch)
    for first in range(51, 351, 50):
        lines = [services.LogLineIn("stdout", f"line {i}", now) for i in range(first, first + 50)]
        services.job_logs_append(node_id=node_id, job_id=job.pk, epoch="e", first=first, lines=lines)
    oldest = JobLogLine.objects.filter(job=job).order_by("seq").first().seq
    assert oldest > 200
    assert services.job_logs_append(node_id=node_id, job_id=job.pk, epoch="e", first=1, lines=batch) == 0
    assert JobLogLine.objects.filter(job=job).order_by("seq").first().seq == oldest


@pytest.mark.django_db(transaction=True)
def test_parallel_log_batches_of_one_job_each_land_once(alice, vision, fleet, submit) -> None:
    """Eight threads (own connections) deliver 40 batches of one job, shuffled, half of them twice: every line is
    stored exactly once at its own seq."""
    job = _running(submit, alice, vision, fleet)
    node_id, now = fleet["node01"].pk, timezone.now()
    batches = [(first, [services.LogLineIn("stdout", f"line {i}", now) for i in range(first, first + 10)])
               for first in range(1, 401, 10)]  # fmt: skip
    work = batches + batches[::2]
    random.Random(7).shuffle(work)
    barrier = threading.Barrier(8)
    stored: list[int] = []
    errors: list[BaseException] = []

    def deliver(part: list[tuple[int, list[services.LogLineIn]]]) -> None:
        try:
            barrier.wait()
            for first, lines in part:
                stored.append(
                    services.job_logs_append(node_id=node_id, job_id=job.pk, epoch="e", first=first, lines=lines)
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(work[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(stored) == 400
    assert _lines(job) == [(i, f"line {i}") for i in range(1, 401)]
    job.refresh_from_db()
    assert (job.log_seq, job.log_agent_seq) == (400, 400)


def test_forged_or_foreign_reports_are_refused(alice, charlie, vision, fleet, submit, sent) -> None:
    _, token = fleet_services_issue("node01")
    _, other = fleet_services_issue("node02")
    job = _running(submit, alice, vision, fleet)
    now = timezone.now().timestamp()
    body = {"job_id": job.pk, "state": "succeeded", "reason": "exit_code", "exit_code": 0, "message": "",
            "finished_at": now, "log_total": 0}  # fmt: skip
    assert not tasks.report_exit({"node": "node01", "token": "gpn_bad_token", **body})
    # node02's agent, with a valid token, reporting on a job that runs on node01.
    assert not tasks.report_exit({"node": "node02", "token": other, **body})
    assert not tasks.report_exit({"node": "node01", "token": token, **body, "state": "exploded"})
    assert not tasks.report_logs({"node": "node01", "token": token, "batches": "nope"})
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_log_lines_from_a_clock_ahead_are_stamped_at_most_now(alice, vision, fleet, submit) -> None:
    # A future stamp would also make log readers wait at a gap behind the line for as long as the clock is ahead.
    job = _running(submit, alice, vision, fleet)
    before = timezone.now()
    ahead = before + timedelta(hours=1)
    services.job_logs_append(
        node_id=fleet["node01"].pk, job_id=job.pk, epoch="e", first=1, lines=[services.LogLineIn("stdout", "x", ahead)]
    )
    stored = JobLogLine.objects.get(job=job, seq=1).at
    assert before <= stored <= timezone.now()


def test_logs_are_bounded_per_job(alice, vision, fleet, submit, monkeypatch) -> None:
    monkeypatch.setattr(conf, "MAX_LOG_LINES", 250)
    monkeypatch.setattr(conf, "MAX_LOG_LINE_CHARS", 10)
    job = _running(submit, alice, vision, fleet)
    now = timezone.now()
    for first in range(1, 1001, 100):
        lines = [services.LogLineIn("stdout", f"line {i} " + "x" * 50, now) for i in range(first, first + 100)]
        services.job_logs_append(node_id=fleet["node01"].pk, job_id=job.pk, epoch="e", first=first, lines=lines)
    kept = JobLogLine.objects.filter(job=job)
    assert 250 <= kept.count() <= 350
    assert kept.order_by("seq").last().seq == 1000
    assert all(len(line) <= 10 for line in kept.values_list("line", flat=True))


def test_a_silent_node_loses_its_jobs_and_frees_their_gpus(alice, vision, fleet, submit, sent) -> None:
    job = _running(submit, alice, vision, fleet)
    last = timezone.now() - timedelta(seconds=conf.NODE_LOST_TIMEOUT_S + 5)
    type(fleet["node01"]).objects.filter(pk=fleet["node01"].pk).update(last_heartbeat=last, status="offline")
    assert services.jobs_sweep()["lost"] == 1
    job.refresh_from_db()
    assert (job.state, job.reason) == ("lost", "node_lost")
    alloc = Allocation.objects.get(job_id=job.pk)
    assert not alloc.active or alloc.end <= max(last, alloc.start)
    assert services.jobs_sweep()["lost"] == 0  # idempotent


def test_an_unacknowledged_launch_is_resent_then_fails(alice, vision, fleet, submit, sent) -> None:
    job = submit(alice, vision)
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    later = timezone.now() + timedelta(seconds=conf.LAUNCH_RESEND_S + 1)
    assert services.jobs_sweep(now=later)["resent"] == 1
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.launch_attempts == 2
    much_later = timezone.now() + timedelta(seconds=conf.LAUNCH_TIMEOUT_S + 1)
    type(fleet["node01"]).objects.filter(pk=fleet["node01"].pk).update(last_heartbeat=much_later)  # node alive
    assert services.jobs_sweep(now=much_later)["launch_failed"] == 1
    job.refresh_from_db()
    assert (job.state, job.reason) == ("failed", "launch_error")
    assert "never acknowledged" in job.message


def test_a_stop_the_node_never_acted_on_is_asked_again(
    alice, vision, fleet, submit, sent, django_capture_on_commit_callbacks
) -> None:
    """A cancel lost with the broker (Redis restarted empty) left the job running until its max_duration."""
    job = _running(submit, alice, vision, fleet)

    def cancels() -> int:
        return len([s for s in sent if s["task"] == "agent.cancel_job"])

    with django_capture_on_commit_callbacks(execute=True):
        services.job_cancel(job=job, user=alice)
    assert cancels() == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert services.jobs_sweep()["stop_resent"] == 0  # the node has its grace and then some
    later = timezone.now() + timedelta(seconds=conf.STOP_RESEND_S + 1)
    type(fleet["node01"]).objects.filter(pk=fleet["node01"].pk).update(last_heartbeat=later)  # node alive
    with django_capture_on_commit_callbacks(execute=True):
        assert services.jobs_sweep(now=later)["stop_resent"] == 1
    assert cancels() == 2
    job.refresh_from_db()
    assert (job.state, job.stop_reason) == (JobState.RUNNING, "cancelled")
    assert services.job_report_exit(node_id=fleet["node01"].pk, job_id=job.pk, state="cancelled", reason="cancelled",
                                    exit_code=143, message="", finished_at=timezone.now(), log_total=0)  # fmt: skip
    assert services.jobs_sweep(now=later)["stop_resent"] == 0


def test_inventory_repairs_both_ways(alice, vision, fleet, submit, sent, django_capture_on_commit_callbacks) -> None:
    gone = _running(submit, alice, vision, fleet)
    alive = _running(submit, alice, vision, {**fleet, "gpus01": fleet["gpus01"][1:]})
    starting = services.job_start(
        job=submit(alice, vision), node=fleet["node01"], gpus=fleet["gpus01"][2:3], now=timezone.now()
    )
    finished = _running(submit, alice, vision, {**fleet, "gpus01": fleet["gpus01"][3:]})
    services.job_mark_lost(job=finished, message="portal gave up", allocation_end=timezone.now())
    items = [
        services.InventoryItem(alive.pk, "running"),
        services.InventoryItem(starting.pk, "running"),
        services.InventoryItem(finished.pk, "running"),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        done = services.node_reconcile(node=fleet["node01"], items=items, complete=True)
    assert done == {"lost": [gone.pk], "stop": [finished.pk], "running": [starting.pk]}
    assert Job.objects.get(pk=gone.pk).state == JobState.LOST
    assert Job.objects.get(pk=starting.pk).state == JobState.RUNNING
    assert Job.objects.get(pk=alive.pk).state == JobState.RUNNING
    assert [s["task"] for s in sent if s["task"] == "agent.cancel_job"] == ["agent.cancel_job"]


def test_a_job_the_inventory_lists_as_exited_waits_for_its_exit_report(alice, vision, fleet, submit, sent) -> None:
    """The agent sent the exit before the inventory, but another worker applies it after: not lost (it was, 1 in
    450 jobs in bench/jobs_e2e at 15 jobs/s), and an exited job the portal has ended is not stopped again."""
    _, token = fleet_services_issue("node01")
    ended_here = _running(submit, alice, vision, fleet)
    already_over = _running(submit, alice, vision, {**fleet, "gpus01": fleet["gpus01"][1:]})
    services.job_mark_lost(job=already_over, message="portal gave up", allocation_end=timezone.now())
    env = {"node": "node01", "token": token, "ts": timezone.now().timestamp()}
    inventory = [{"job_id": ended_here.pk, "status": "exited"}, {"job_id": already_over.pk, "status": "exited"}]
    assert tasks.report_inventory({**env, "jobs": inventory, "complete": True}) == {
        "lost": [], "stop": [], "running": [],
    }  # fmt: skip
    assert Job.objects.get(pk=ended_here.pk).state == JobState.RUNNING
    exit_body = {"job_id": ended_here.pk, "state": "succeeded", "reason": "exit_code", "exit_code": 0, "message": "",
                 "finished_at": timezone.now().timestamp(), "log_total": 0}  # fmt: skip
    assert tasks.report_exit({**env, **exit_body})
    assert Job.objects.get(pk=ended_here.pk).state == JobState.SUCCEEDED
    assert not [s for s in sent if s["task"] == "agent.cancel_job"]
    # An unknown status is refused whole.
    assert tasks.report_inventory({**env, "jobs": [{"job_id": 1, "status": "gone"}], "complete": True}) == {}


def test_reservation_end_stops_its_jobs_as_preempted(alice, vision, fleet, submit, sent) -> None:
    from apps.booking.hooks import _reservation_ended
    from apps.booking.models import Reservation
    from apps.jobs.hooks import stop_jobs_after_grace

    assert stop_jobs_after_grace in _reservation_ended  # registered when the app loads
    now = timezone.now()
    resv = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=now - timedelta(hours=1), end=now + timedelta(hours=1),
        booked_end=now + timedelta(hours=1), status="active", gpu_model=fleet["a100"],
    )  # fmt: skip
    Allocation.objects.create(
        gpu=fleet["gpus01"][0], team=vision, kind="reservation", reservation=resv, start=resv.start, end=resv.end
    )
    job = submit(alice, vision, reservation_id=resv.pk, max_duration_s=600)
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=now)
    assert services.jobs_stop_for_reservation(
        reservation_id=resv.pk, team_id=vision.pk, gpu_ids=[fleet["gpus01"][0].pk]
    ) == [job.pk]
    job.refresh_from_db()
    assert job.stop_reason == "preempted"
    node = fleet["node01"]
    assert services.job_report_exit(
        node_id=node.pk, job_id=job.pk, state="cancelled", reason="cancelled", exit_code=143, message="stopped",
        finished_at=timezone.now(), log_total=0,
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.reason) == ("cancelled", "preempted")


def test_quota_refuses_a_submission_that_does_not_fit(alice, vision, fleet, submit, api_as) -> None:
    Quota.objects.create(team=vision, month=None, gpu_hours=Decimal("1"))
    resp = api_as(alice).post(
        "/api/v1/jobs/",
        {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], "gpu_count": 2,
         "max_duration_s": 3600},
        format="json",
    )  # fmt: skip
    assert resp.status_code == 403 and resp.json()["code"] == "quota_exceeded"
    assert Job.objects.count() == 0


def test_concurrent_gpu_quota_keeps_a_job_queued_until_a_gpu_is_given_back(alice, vision, fleet, submit, sent) -> None:
    Quota.objects.create(team=vision, month=None, max_concurrent_gpus=1)
    first = submit(alice, vision)
    second = submit(alice, vision)
    result = scheduler.run_pass(token=1, leader="t", policy=FAIR)
    assert result.started == [first.pk]
    assert result.refused == {second.pk: "quota_exceeded"}
    second.refresh_from_db()
    assert second.state == JobState.QUEUED and second.pending_reason == "quota_exceeded"
    first.refresh_from_db()
    services.job_transition(first, JobState.RUNNING)
    services.job_transition(Job.objects.get(pk=first.pk), JobState.SUCCEEDED, reason="exit_code", exit_code=0)
    assert scheduler.run_pass(token=1, leader="t", policy=FAIR).started == [second.pk]
