"""REST: /api/v1/images/, /api/v1/jobs/ (submit, list, filters), detail, cancel, logs; scoping and scopes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import Job, JobState
from tests.jobs.conftest import BUSYBOX

pytestmark = pytest.mark.django_db

BODY = {"team": "vision", "image": BUSYBOX, "command": ["echo", "hello"], "gpu_count": 1, "max_duration_s": 300}


def test_images_lists_the_allow_list(alice, images, api_as):
    resp = api_as(alice).get("/api/v1/images/")
    assert resp.status_code == 200
    names = [i["name"] for i in resp.json()["results"]]
    assert names == sorted([BUSYBOX, "local/process"])
    assert set(resp.json()["results"][0]) == {"name", "description"}


def test_anonymous_gets_401_everywhere(fleet, images, api_as):
    client = api_as(None)
    for path in ("/api/v1/images/", "/api/v1/jobs/", "/api/v1/jobs/1/", "/api/v1/jobs/1/logs/"):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert resp.json()["code"] == "unauthenticated"
    assert client.post("/api/v1/jobs/", BODY, format="json").status_code == 401


def test_submit_returns_201_with_the_job(alice, fleet, images, api_as):
    resp = api_as(alice).post("/api/v1/jobs/", BODY, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["state"] == "queued"
    assert body["team"] == "vision" and body["user"] == "alice"
    assert body["command"] == ["echo", "hello"]
    assert body["events"][0]["to_state"] == "queued"
    assert body["submitted_at"].endswith("+00:00") or body["submitted_at"].endswith("Z")


def test_team_may_be_omitted_by_a_member_of_one_team(alice, fleet, images, api_as):
    body = {k: v for k, v in BODY.items() if k != "team"}
    assert api_as(alice).post("/api/v1/jobs/", body, format="json").status_code == 201


def test_idempotency_key_replays_the_submission(alice, fleet, images, api_as):
    client = api_as(alice)
    first = client.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="ci-run-7")
    second = client.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="ci-run-7")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"command": "echo hello"}, 400, "invalid"),
        ({"image": "docker.io/library/ubuntu:latest"}, 400, "image_not_allowed"),
        ({"privileged": True}, 403, "policy_violation"),
        ({"network_mode": "host"}, 403, "policy_violation"),
        ({"network": "host"}, 403, "policy_violation"),
        ({"pid_mode": "host"}, 403, "policy_violation"),
        ({"devices": ["/dev/mem:/dev/mem"]}, 403, "policy_violation"),
        ({"cap_add": ["NET_ADMIN"]}, 403, "policy_violation"),
        ({"mounts": [{"host_path": "/", "container_path": "/host"}]}, 403, "policy_violation"),
        ({"gpu_count": 64}, 400, "invalid"),
        ({"gpu_count": "two"}, 400, "invalid"),
        ({"gpu_model": "TPUv5"}, 400, "invalid"),
        ({"max_duration_s": 10**9}, 400, "invalid"),
        ({"priority": 99}, 400, "invalid"),
        ({"env": {"A-B": "1"}}, 400, "invalid"),
        ({"shell": True}, 400, "invalid"),
        ({"team": "nlp"}, 403, "forbidden"),
        ({"team": "nope"}, 404, "not_found"),
        ({"reservation": 999999}, 404, "not_found"),
    ],
)
def test_bad_submissions_get_the_error_shape_and_queue_nothing(alice, nlp, fleet, images, api_as, change, status, code):
    resp = api_as(alice).post("/api/v1/jobs/", {**BODY, **change}, format="json")
    assert resp.status_code == status, resp.json()
    body = resp.json()
    assert body["code"] == code
    assert set(body) >= {"code", "detail", "fields"}
    assert Job.objects.count() == 0


def test_shell_string_says_so(alice, fleet, images, api_as):
    resp = api_as(alice).post("/api/v1/jobs/", {**BODY, "command": "echo hi"}, format="json")
    assert resp.json()["detail"] == "command must be a list of arguments"
    assert "command" in resp.json()["fields"]


def test_read_only_token_cannot_submit_or_cancel(alice, fleet, images, api_as, submit, vision):
    client = api_as(alice, ["read"])
    resp = client.post("/api/v1/jobs/", BODY, format="json")
    assert resp.status_code == 403 and resp.json()["code"] == "insufficient_scope"
    job = submit(alice, vision)
    resp = client.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert resp.status_code == 403 and resp.json()["code"] == "insufficient_scope"
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 200


def test_list_is_scoped_to_the_teams_of_the_viewer(alice, bob, charlie, admin, vision, nlp, submit, api_as):
    mine = submit(alice, vision)
    theirs = submit(charlie, nlp)
    ids = lambda user: {j["id"] for j in api_as(user).get("/api/v1/jobs/").json()["results"]}  # noqa: E731
    assert ids(alice) == {mine.pk}
    assert ids(bob) == {mine.pk}
    assert ids(charlie) == {theirs.pk}
    assert ids(admin) == {mine.pk, theirs.pk}


def test_detail_and_logs_of_someone_elses_job_are_404(alice, charlie, vision, submit, api_as):
    job = submit(alice, vision)
    client = api_as(charlie)
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
    assert client.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_list_filters(alice, bob, vision, submit, api_as):
    a = submit(alice, vision)
    b = submit(bob, vision)
    services.job_cancel(job=b, user=bob)
    client = api_as(alice)
    assert [j["id"] for j in client.get("/api/v1/jobs/?state=queued").json()["results"]] == [a.pk]
    assert [j["id"] for j in client.get("/api/v1/jobs/?state=cancelled,failed").json()["results"]] == [b.pk]
    assert [j["id"] for j in client.get("/api/v1/jobs/?user=bob").json()["results"]] == [b.pk]
    assert len(client.get("/api/v1/jobs/?team=vision").json()["results"]) == 2
    assert [j["id"] for j in client.get("/api/v1/jobs/?state=failed, cancelled").json()["results"]] == [b.pk]
    refused = client.get("/api/v1/jobs/?state=sleeping")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid" and "sleeping" in refused.json()["fields"]["state"][0]


def test_env_values_are_shown_to_the_submitter_only(alice, bob, vision, submit, api_as):
    job = submit(alice, vision, env={"WANDB_API_KEY": "s3cret"})
    assert api_as(alice).get(f"/api/v1/jobs/{job.pk}/").json()["env"] == {"WANDB_API_KEY": "s3cret"}
    assert api_as(bob).get(f"/api/v1/jobs/{job.pk}/").json()["env"] == {"WANDB_API_KEY": "***"}


def test_cancel_a_queued_job(alice, vision, submit, api_as):
    job = submit(alice, vision)
    resp = api_as(alice).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert resp.status_code == 202
    assert resp.json()["state"] == "cancelled" and resp.json()["reason"] == "cancelled"
    again = api_as(alice).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert again.status_code == 409 and again.json()["code"] == "job_finished"


def test_teammate_may_not_cancel_but_the_manager_may(alice, bob, vision, submit, api_as):
    bobs = submit(bob, vision)
    alices = submit(alice, vision)
    assert api_as(bob).post(f"/api/v1/jobs/{alices.pk}/cancel/").status_code == 403
    assert api_as(alice).post(f"/api/v1/jobs/{bobs.pk}/cancel/").status_code == 202


def test_logs_follow_with_after(alice, vision, submit, api_as, fleet):
    from apps.jobs.models import JobLogLine

    job = submit(alice, vision)
    now = timezone.now()
    JobLogLine.objects.bulk_create(
        [JobLogLine(job=job, seq=i, stream="stdout", at=now + timedelta(seconds=i), line=f"l{i}") for i in range(1, 6)]
    )
    Job.objects.filter(pk=job.pk).update(log_seq=5)
    client = api_as(alice)
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=2").json()
    assert [line["line"] for line in body["lines"]] == ["l3", "l4", "l5"]
    assert body["last_seq"] == 5
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=5").json()
    assert body["lines"] == [] and body["last_seq"] == 5
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=0&limit=2").json()
    assert [line["seq"] for line in body["lines"]] == [1, 2] and body["more"] is True
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/?after=x").status_code == 400


def test_logs_after_a_missing_line_wait_for_it_then_pass_a_gap_that_stays(alice, vision, submit, api_as, monkeypatch):
    # Batches can arrive out of order: a follower given line 4 before 3 would move its cursor past 3 for good.
    from apps.jobs import conf
    from apps.jobs.models import JobLogLine

    monkeypatch.setattr(conf, "LOG_GAP_WAIT_S", 10)
    job = submit(alice, vision)
    now = timezone.now()
    JobLogLine.objects.bulk_create(
        [JobLogLine(job=job, seq=i, stream="stdout", at=now, line=f"l{i}") for i in (1, 2, 4, 5)]
    )
    Job.objects.filter(pk=job.pk).update(log_seq=5)
    client = api_as(alice)
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=0").json()
    assert [line["seq"] for line in body["lines"]] == [1, 2]
    assert (body["last_seq"], body["waiting"], body["more"]) == (2, True, False)
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=2").json()
    assert (body["lines"], body["last_seq"], body["waiting"]) == ([], 2, True)

    JobLogLine.objects.create(job=job, seq=3, stream="stdout", at=now, line="l3")  # the late line lands
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=2").json()
    assert [line["seq"] for line in body["lines"]] == [3, 4, 5]
    assert (body["last_seq"], body["waiting"]) == (5, False)

    # A gap that stays (lines the agent dropped) is passed once the line after it is LOG_GAP_WAIT_S old.
    JobLogLine.objects.bulk_create(
        [JobLogLine(job=job, seq=i, stream="stdout", at=now - timedelta(seconds=11), line=f"l{i}") for i in (8, 9)]
    )
    Job.objects.filter(pk=job.pk).update(log_seq=9)
    body = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=5").json()
    assert [line["seq"] for line in body["lines"]] == [8, 9]
    assert (body["last_seq"], body["waiting"]) == (9, False)


def test_logs_do_not_wait_for_lines_below_the_kept_window(alice, vision, submit, api_as, monkeypatch):
    from apps.jobs import conf
    from apps.jobs.models import JobLogLine

    monkeypatch.setattr(conf, "MAX_LOG_LINES", 3)
    job = submit(alice, vision)
    now = timezone.now()
    # Lines 1-6 were trimmed (or a late batch of them was not stored); 7-9 are the kept window.
    JobLogLine.objects.bulk_create(
        [JobLogLine(job=job, seq=i, stream="stdout", at=now, line=f"l{i}") for i in (7, 8, 9)]
    )
    Job.objects.filter(pk=job.pk).update(log_seq=9)
    body = api_as(alice).get(f"/api/v1/jobs/{job.pk}/logs/?after=0").json()
    assert [line["seq"] for line in body["lines"]] == [7, 8, 9]
    assert (body["last_seq"], body["waiting"]) == (9, False)
