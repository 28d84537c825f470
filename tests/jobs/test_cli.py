"""The gpuportal client: exit codes, the error shape printed clearly, and commands against a live server."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from cli import gpuportal
from tests.conftest import REPO
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
    assert gpuportal.main(["status", "1"]) == 2
    assert "GPUPORTAL_URL" in capsys.readouterr().err
    monkeypatch.setenv("GPUPORTAL_URL", "http://127.0.0.1:9")
    assert gpuportal.main(["status", "1"]) == 2
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
    assert refused.returncode == 2
    assert "is not on the portal's allow-list. (image_not_allowed)" in refused.stderr
    assert "image:" in refused.stderr  # the per-field message too

    too_big = _run(live_portal, token, "submit", "--image", BUSYBOX, "--gpus", "12", "--", "true")
    assert too_big.returncode == 2 and "No node has 12" in too_big.stderr

    queued = _run(live_portal, token, "submit", "--image", BUSYBOX, "--env", "A=1", "--", "echo", "hi")
    assert queued.returncode == 0, queued.stderr
    job_id = int(queued.stdout.strip())

    status = _run(live_portal, token, "status", str(job_id))
    assert status.returncode == 0 and f"job {job_id} queued" in status.stdout

    cancelled = _run(live_portal, token, "cancel", str(job_id))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = _run(live_portal, token, "cancel", str(job_id))
    assert again.returncode == 2 and "job_finished" in again.stderr

    logs = _run(live_portal, token, "logs", str(job_id), "--follow")
    assert logs.returncode == 130  # it was cancelled

    read_only = _run(live_portal, make_token(alice, ["read"]), "submit", "--image", BUSYBOX, "--", "true")
    assert read_only.returncode == 2 and "insufficient_scope" in read_only.stderr
    missing = _run(live_portal, token, "status", "999999")
    assert missing.returncode == 2 and "not_found" in missing.stderr
