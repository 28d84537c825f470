"""End to end with a real dockerd and the locally built busybox image: REST → scheduler process → launch command
over the broker → agent process (docker runtime) → reports on the control queue → portal Celery worker →
job_transition. Outcomes: success, exit code 3, OOM kill, timeout, cancel, missing image; an agent SIGKILLed
mid-job and restarted; a node that goes offline; the CLI's `submit --wait` exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from django.utils import timezone

from apps.booking.models import Allocation
from apps.fleet.models import Node
from apps.jobs.models import ContainerImage, Job
from tests.conftest import REPO
from tests.fleet.procs import wait_for
from tests.jobs.stack import Stack, start_stack
from tests.support.dockerd import IMAGE, dockerd  # noqa: F401 - the session fixture

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

MISSING = "portal-test/not-built-here:1.0"
HOG = 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}'


@pytest.fixture
def stack(tmp_path, dockerd, alice, vision, make_token) -> Iterator[Stack]:  # noqa: F811
    ContainerImage.objects.create(name=IMAGE, description="busybox")
    ContainerImage.objects.create(name=MISSING, description="allowed, but no node has it")
    running = start_stack(
        tmp_path,
        user=alice,
        make_token=make_token,
        runtime="docker",
        docker_url=dockerd,
        gpus=8,
        scheduler_env={"JOBS_NODE_LOST_TIMEOUT_S": "6"},
    )
    yield running
    running.stop()


def containers(url: str, job_id: int, *, running_only: bool = False) -> list[Any]:
    client = docker.DockerClient(base_url=url, version="auto")
    try:
        return client.containers.list(all=not running_only, filters={"label": f"portal.job={job_id}"})
    finally:
        client.close()


def _texts(stack: Stack, job_id: int, stream: str | None = None) -> list[str]:
    return [line["line"] for line in stack.logs(job_id) if stream is None or line["stream"] == stream]


def test_outcomes_through_the_whole_path(stack: Stack) -> None:
    ok = stack.submit(image=IMAGE, command=["sh", "-c", "echo hello; echo to-stderr >&2; echo bye"])
    three = stack.submit(image=IMAGE, command=["sh", "-c", "echo failing; exit 3"])
    oom = stack.submit(image=IMAGE, command=["sh", "-c", HOG], memory_mib=16)
    slow = stack.submit(image=IMAGE, command=["sh", "-c", "echo waiting; sleep 120"], max_duration_s=3)
    cancel = stack.submit(image=IMAGE, command=["sh", "-c", "echo started; sleep 120"])
    missing = stack.submit(image=MISSING, command=["true"])

    stack.wait_state(cancel["id"], {"running"})
    wait_for(lambda: "started" in _texts(stack, cancel["id"]), 20, "the job's first line", stack.procs)
    t0 = time.monotonic()
    resp = stack.api("POST", f"/api/v1/jobs/{cancel['id']}/cancel/")
    assert resp.status_code == 202, resp.text

    done = {job["id"]: stack.wait_done(job["id"], timeout=90) for job in (ok, three, oom, slow, cancel, missing)}

    job = done[ok["id"]]
    assert (job["state"], job["reason"], job["exit_code"]) == ("succeeded", "exit_code", 0)
    assert _texts(stack, ok["id"], "stdout") == ["hello", "bye"]
    assert _texts(stack, ok["id"], "stderr") == ["to-stderr"]
    assert job["node"] == "jobnode0" and len(job["gpus"]) == 1
    assert [e["to_state"] for e in job["events"]] == ["queued", "starting", "running", "succeeded"]

    job = done[three["id"]]
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit_code", 3)
    assert _texts(stack, three["id"]) == ["failing"]

    job = done[oom["id"]]
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "oom", 137)

    job = done[slow["id"]]
    assert (job["state"], job["reason"]) == ("failed", "timeout")
    assert _texts(stack, slow["id"]) == ["waiting"]

    job = done[cancel["id"]]
    assert (job["state"], job["reason"]) == ("cancelled", "cancelled")
    assert time.monotonic() - t0 < 30  # SIGTERM (busybox sh as PID 2 under init dies on it), grace, SIGKILL

    job = done[missing["id"]]
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "launch_error", None)
    assert "No such image" in job["message"] or "not found" in job["message"].lower()

    # Every GPU is free again, and nothing is left on the engine.
    now = timezone.now()
    assert not Allocation.objects.filter(kind="job", active=True, start__lte=now, end__gt=now).exists()
    for job_id in done:
        wait_for(lambda j=job_id: not containers(stack.docker_url, j), 20, f"containers of {job_id} removed")

    # The CLI against the live server: `submit --wait` exits with the job's exit code and prints its logs.
    cli = _cli(stack)
    result = subprocess.run(
        [*cli, "submit", "--gpus", "1", "--image", IMAGE, "--team", "vision", "--wait", "--", "sh", "-c",
         "echo from-cli; exit 3"],
        capture_output=True, text=True, timeout=120, env=_cli_env(stack),
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "from-cli" in result.stdout
    result = subprocess.run(
        [*cli, "submit", "--gpus", "1", "--image", IMAGE, "--team", "vision", "--wait", "--", "echo", "fine"],
        capture_output=True, text=True, timeout=120, env=_cli_env(stack),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "fine" in result.stdout


def _cli(stack: Stack) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "gpuportal")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "cli.gpuportal"]


def _cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.update({"GPUPORTAL_URL": stack.server.url, "GPUPORTAL_TOKEN": stack.api_token, "PYTHONPATH": str(REPO)})
    return env


def test_agent_killed_mid_job_and_restarted_reconciles_the_job(stack: Stack) -> None:
    job = stack.submit(image=IMAGE, command=["sh", "-c", "echo before; sleep 8; echo after; exit 7"])
    stack.wait_state(job["id"], {"running"})
    wait_for(lambda: "before" in _texts(stack, job["id"]), 20, "the first line", stack.procs)

    stack.agents["jobnode0"].kill()  # SIGKILL: no goodbye, the container keeps running
    assert containers(stack.docker_url, job["id"], running_only=True)
    stack.restart_agent("jobnode0")

    final = stack.wait_done(job["id"], timeout=60)
    assert (final["state"], final["reason"], final["exit_code"]) == ("failed", "exit_code", 7)
    assert "after" in _texts(stack, job["id"])  # lines printed after the restart arrive too
    assert Job.objects.get(pk=job["id"]).events.filter(to_state="lost").count() == 0


def test_a_node_that_goes_offline_loses_its_jobs_and_its_gpus_are_freed(stack: Stack) -> None:
    job = stack.submit(image=IMAGE, command=["sh", "-c", "echo up; sleep 300"], max_duration_s=600)
    stack.wait_state(job["id"], {"running"})
    stack.agents["jobnode0"].kill()

    final = stack.wait_state(job["id"], {"lost"}, timeout=60)
    assert final["reason"] == "node_lost"
    node = Node.objects.get(name="jobnode0")
    allocation = Allocation.objects.get(job_id=job["id"])
    assert node.last_heartbeat is not None
    # Freed from the last heartbeat (a job scheduled after it never held its GPUs: the row is deactivated).
    assert not allocation.active or allocation.end <= node.last_heartbeat + timezone.timedelta(seconds=1)
    now = timezone.now()
    assert not Allocation.objects.filter(job_id=job["id"], active=True, end__gt=now).exists()

    # The node comes back: the portal says the job is over, so its orphaned container is stopped.
    assert containers(stack.docker_url, job["id"], running_only=True)
    stack.restart_agent("jobnode0")
    wait_for(
        lambda: not containers(stack.docker_url, job["id"], running_only=True),
        60,
        "the orphaned container to be stopped",
        stack.procs,
    )
    assert stack.job(job["id"])["state"] == "lost"
