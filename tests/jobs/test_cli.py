"""The gpuportal client: exit codes, the error shape printed clearly, and commands against a live server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import Job, JobState
from cli import gpuportal
from tests.conftest import REPO, LiveServer, start_live_server
from tests.jobs.conftest import BUSYBOX


@pytest.mark.parametrize(
    ("job", "code"),
    [
        ({"state": "succeeded", "reason": "exit_code", "exit_code": 0}, 0),
        ({"state": "failed", "reason": "exit_code", "exit_code": 3}, 3),
        ({"state": "failed", "reason": "exit_code", "exit_code": 300}, 1),
        ({"state": "failed", "reason": "oom", "exit_code": 137}, 137),
        ({"state": "failed", "reason": "timeout", "exit_code": 143}, 124),
        ({"state": "failed", "reason": "launch_error", "exit_code": None}, 125),
        ({"state": "cancelled", "reason": "cancelled", "exit_code": None}, 130),
        ({"state": "cancelled", "reason": "preempted", "exit_code": None}, 130),
        ({"state": "lost", "reason": "node_lost", "exit_code": None}, 75),
        ({"state": "failed", "reason": "exit_code", "exit_code": None}, 1),
    ],
)
def test_exit_codes(job: dict[str, Any], code: int) -> None:
    assert gpuportal.exit_code_of(job) == code


def test_configuration_is_required(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPORTAL_URL", raising=False)
    monkeypatch.delenv("GPUPORTAL_TOKEN", raising=False)
    assert gpuportal.main(["status", "1"]) == gpuportal.EXIT_USAGE
    assert "GPUPORTAL_URL" in capsys.readouterr().err
    monkeypatch.setenv("GPUPORTAL_URL", "http://127.0.0.1:9")
    assert gpuportal.main(["status", "1"]) == gpuportal.EXIT_USAGE
    assert "GPUPORTAL_TOKEN" in capsys.readouterr().err


def _run(live: Any, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.update({"GPUPORTAL_URL": live.url, "GPUPORTAL_TOKEN": token, "PYTHONPATH": str(REPO)})
    return subprocess.run(
        [sys.executable, "-m", "cli.gpuportal", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_commands_against_a_live_server(alice, vision, fleet, images, make_token, live_portal) -> None:
    token = make_token(alice, ["read", "jobs:write"])
    refused = _run(live_portal, token, "submit", "--image", "evil/miner", "--team", "vision", "--", "mine")
    assert refused.returncode == gpuportal.EXIT_REFUSED
    assert "is not on the portal's allow-list. (image_not_allowed)" in refused.stderr
    assert "image:" in refused.stderr  # the per-field message too

    too_big = _run(live_portal, token, "submit", "--image", BUSYBOX, "--gpus", "12", "--", "true")
    assert too_big.returncode == gpuportal.EXIT_REFUSED and "No node has 12" in too_big.stderr
    no_pool = _run(live_portal, token, "submit", "--image", BUSYBOX, "--pool", "nowhere", "--", "true")
    assert no_pool.returncode == gpuportal.EXIT_REFUSED and "There is no pool 'nowhere'" in no_pool.stderr

    queued = _run(live_portal, token, "submit", "--image", BUSYBOX, "--env", "A=1", "--", "echo", "hi")
    assert queued.returncode == 0, queued.stderr
    job_id = int(queued.stdout.strip())

    status = _run(live_portal, token, "status", str(job_id))
    assert status.returncode == 0 and f"job {job_id} queued" in status.stdout

    cancelled = _run(live_portal, token, "cancel", str(job_id))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = _run(live_portal, token, "cancel", str(job_id))
    assert again.returncode == gpuportal.EXIT_REFUSED and "job_finished" in again.stderr

    logs = _run(live_portal, token, "logs", str(job_id), "--follow")
    assert logs.returncode == 130  # it was cancelled

    read_only = _run(live_portal, make_token(alice, ["read"]), "submit", "--image", BUSYBOX, "--", "true")
    assert read_only.returncode == gpuportal.EXIT_REFUSED and "insufficient_scope" in read_only.stderr
    missing = _run(live_portal, token, "status", "999999")
    assert missing.returncode == gpuportal.EXIT_REFUSED and "not_found" in missing.stderr


@pytest.fixture
def portal_gap_3s(transactional_db: Any) -> Iterator[LiveServer]:
    """A live portal whose log readers wait at most 3 s at a missing line (the default is 10 s)."""
    server = start_live_server(JOBS_LOG_GAP_WAIT_S="3")
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_follow_prints_a_late_line_in_its_place_and_passes_a_gap_that_stays(
    alice, vision, fleet, submit, make_token, portal_gap_3s, capsys, monkeypatch
) -> None:
    """A batch that reaches the portal late (taken second by a worker, or sent again after a broker outage) is
    stored in its place; the portal holds the lines after the gap back for it (here up to 3 s), and `follow`
    prints in order whatever it is given."""
    node = fleet["node01"].pk
    client = gpuportal.Client(portal_gap_3s.url, make_token(alice, ["read"]))

    def running_job() -> Job:
        job = services.job_start(
            job=submit(alice, vision), node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now()
        )
        return services.job_transition(job, JobState.RUNNING)

    def append(job: Job, first: int, *texts: str) -> None:
        lines = [services.LogLineIn("stdout", text, timezone.now()) for text in texts]
        services.job_logs_append(node_id=node, job_id=job.pk, epoch="e", first=first, lines=lines)

    def end(job: Job) -> None:
        services.job_report_exit(node_id=node, job_id=job.pk, state="succeeded", reason="exit_code", exit_code=0,
                                 message="", finished_at=timezone.now(), log_total=3)  # fmt: skip

    monkeypatch.setattr(gpuportal, "GAP_WAIT_S", 15.0)  # ends as soon as the gap fills; room for a slow machine
    late = running_job()
    append(late, 1, "one")
    append(late, 3, "three")  # "two" is on its way

    def deliver_the_late_line() -> None:
        try:
            time.sleep(1.0)
            append(late, 2, "two")
            end(late)
        finally:
            connection.close()

    worker = threading.Thread(target=deliver_the_late_line)
    worker.start()
    final = gpuportal.follow(client, late.pk, quiet=True)
    worker.join()
    assert final["state"] == "succeeded"
    assert capsys.readouterr().out.splitlines() == ["one", "two", "three"]

    # A line that never comes: the rest prints once the portal's wait is over, though the job ended before.
    monkeypatch.setattr(gpuportal, "GAP_WAIT_S", 0.5)
    monkeypatch.setattr(gpuportal, "LOG_GRACE_S", 0.5)  # shorter than the portal's wait: `waiting` keeps it reading
    never = running_job()
    append(never, 1, "one")
    append(never, 3, "three")
    end(never)
    assert gpuportal.follow(client, never.pk, quiet=True)["state"] == "succeeded"
    assert capsys.readouterr().out.splitlines() == ["one", "three"]


class _OldPortal:
    """A portal from before `waiting`: it hands out line 3 before line 2 has arrived."""

    def __init__(self) -> None:
        self.reads = 0

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        if path.endswith("/logs/"):
            self.reads += 1
            stored = [(1, "one"), (3, "three")] if self.reads < 3 else [(1, "one"), (2, "two"), (3, "three")]
            lines = [{"seq": s, "stream": "stdout", "line": t} for s, t in stored if s > (params or {})["after"]]
            return {"lines": lines, "last_seq": lines[-1]["seq"] if lines else 0, "more": False}
        return {"id": 7, "state": "succeeded", "logs_complete": True, "log_seq": 3}


def test_follow_against_a_portal_without_waiting_holds_a_gap_itself(capsys, monkeypatch) -> None:
    monkeypatch.setattr(gpuportal, "POLL_S", 0.01)
    monkeypatch.setattr(gpuportal, "GAP_WAIT_S", 30.0)
    portal = _OldPortal()
    assert gpuportal.follow(portal, 7, quiet=True)["state"] == "succeeded"  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == ["one", "two", "three"]
    assert portal.reads >= 3
