"""The Slurm bridge end to end: the portal's API and CLI in front, a real single-host Slurm behind.

A job submitted to the portal for a Slurm-pool GPU model is submitted by the bridge with sbatch (account = team),
run by Slurm, followed back (state, output, exit code), cancelled with scancel; neither a bridge restart nor a
slurmctld restart mid-job loses or doubles it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, LiveServer
from tests.slurm.bridge_procs import MODEL, POOL, BridgeStack, make_stack, running_stack
from tests.support.slurm import Slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(slurm: Slurm, live_portal: LiveServer, alice: Any, make_token: Any, tmp_path: Path) -> Iterator[BridgeStack]:
    yield from running_stack(make_stack(slurm, live_portal, alice, make_token, tmp_path))


def _slurm_jobs_with_comment(slurm: Slurm, job_id: int) -> list[str]:
    out = slurm.run("squeue", "-h", "-t", "all", "-o", "%i|%k").stdout
    return [line.split("|")[0] for line in out.splitlines() if line.endswith(f"|portal-job-{job_id}")]


def test_pool_lists_slurm_gpus(stack: BridgeStack) -> None:
    pools = {p["name"]: p for p in stack.api("GET", "/api/v1/pools/").json()}
    assert pools[POOL]["backend"] == "slurm"
    assert {g["model"] for g in pools[POOL]["gpus"]} == {MODEL}
    assert sorted(g["index"] for g in pools[POOL]["gpus"]) == list(range(stack.slurm.gpu_count))


def test_submit_wait_returns_exit_code_and_logs(stack: BridgeStack) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.update({"GPUPORTAL_URL": stack.server.url, "GPUPORTAL_TOKEN": stack.api_token, "PYTHONPATH": str(REPO)})
    argv = [sys.executable, "-m", "cli.gpuportal", "submit", "--team", "vision", "--image", "slurm/process"]
    argv += ["--model", MODEL, "--gpus", "2", "--max-duration", "120", "--wait", "--"]
    argv += ["sh", "-c", "echo hello from slurm; echo 'quoted $HOME'; exit 3"]
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 3, (done.stdout, done.stderr, stack.log()[-2000:])
    assert "hello from slurm" in done.stdout
    assert "quoted $HOME" in done.stdout
    job_id = int(done.stderr.split("gpuportal: job ", 1)[1].split()[0])
    job = stack.job(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 3
    slurm_ids = _slurm_jobs_with_comment(stack.slurm, job_id)
    assert len(slurm_ids) == 1
    record = stack.slurm.wait_job(slurm_ids[0], {"FAILED"})
    assert record["account"] == "vision"
    gres = [t["count"] for t in record["tres"]["allocated"] if t["type"] == "gres"]  # type: ignore[index]
    assert gres == [2]


def test_cancel_scancels(stack: BridgeStack) -> None:
    job_id = stack.submit(["sh", "-c", "echo started; sleep 600"])
    stack.wait_state(job_id, {"running"})
    resp = stack.api("POST", f"/api/v1/jobs/{job_id}/cancel/")
    assert resp.status_code in {200, 202}, resp.text
    final = stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"})
    assert final["state"] == "cancelled", final
    (slurm_id,) = _slurm_jobs_with_comment(stack.slurm, job_id)
    assert stack.slurm.wait_job(slurm_id, {"CANCELLED"})


def test_timeout_is_reported(stack: BridgeStack) -> None:
    # Slurm's limit is whole minutes: 60 s, and the job outlives it.
    job_id = stack.submit(["sleep", "600"], max_duration_s=60)
    final = stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"}, timeout=150)
    assert (final["state"], final["reason"]) == ("failed", "timeout"), final


def test_bridge_and_slurmctld_restarts_mid_job(stack: BridgeStack) -> None:
    job_id = stack.submit(["sh", "-c", "echo one; sleep 8; echo two; sleep 8; echo three"])
    stack.wait_state(job_id, {"running"})
    stack.kill_bridge()
    stack.slurm.restart_slurmctld()
    stack.start_bridge()
    final = stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"}, timeout=120)
    assert final["state"] == "succeeded", final
    assert len(_slurm_jobs_with_comment(stack.slurm, job_id)) == 1
    lines = stack.api("GET", f"/api/v1/jobs/{job_id}/logs/?after=0&limit=100").json()["lines"]
    assert [line["line"] for line in lines] == ["one", "two", "three"]


def test_bridge_killed_between_claim_and_report_does_not_double(stack: BridgeStack) -> None:
    stack.kill_bridge()
    job_id = stack.submit(["sh", "-c", "sleep 3; echo done"])
    # Submit it by hand as the bridge would have, then "crash" before telling the portal: the restarted bridge
    # must adopt this Slurm job by its comment instead of submitting a second one.
    from apps.jobs.models import Job
    from apps.pools.models import ExternalJob

    ExternalJob.objects.get_or_create(job=Job.objects.get(pk=job_id), defaults={"pool_id": _pool_id()})
    stack.spool.mkdir(parents=True, exist_ok=True)
    stack.slurm.run(
        "sbatch", "--parsable", "-A", "vision", "--gres=gpu:a100:1", "-t", "2", f"--comment=portal-job-{job_id}",
        f"--output={stack.spool / f'job-{job_id}.out'}", "--wrap", "sleep 3; echo done",
    )  # fmt: skip
    stack.start_bridge()
    final = stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"}, timeout=90)
    assert final["state"] == "succeeded", final
    assert len(_slurm_jobs_with_comment(stack.slurm, job_id)) == 1


def _pool_id() -> int:
    from apps.fleet.models import Pool

    return Pool.objects.get(name=POOL).pk
