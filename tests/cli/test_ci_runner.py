"""The gpuportal client as a CI runner drives it: a cancelled pipeline (SIGTERM, SIGHUP) cancels the GPU job; the
client's own failures exit with their own codes (200-204, docs/ci-examples.md), mappable to one; a portal that
accepts connections but never answers is given up on after --timeout with one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import gpuportal
from tests.conftest import REPO
from tests.fleet.procs import wait_for
from tests.jobs.stack import Stack, start_stack

PROCESS_IMAGE = "local/process"


def _cli_env(url: str, token: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.update({"GPUPORTAL_URL": url, "GPUPORTAL_TOKEN": token, "PYTHONPATH": str(REPO), **extra})
    return env


def _cli(url: str, token: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.gpuportal", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_cli_env(url, token, **env),
    )


@pytest.fixture
def silent_portal() -> Iterator[str]:
    """A socket that accepts connections (the kernel completes the handshake from the backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_portal_that_never_answers_gives_the_timeout_code_and_one_line(silent_portal: str) -> None:
    done = _cli(silent_portal, "gpp_x", "--timeout", "1", "status", "1")
    assert done.returncode == gpuportal.EXIT_TIMEOUT == 203
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == f"gpuportal: error: {silent_portal} did not answer within 1 s (GET /jobs/1/); see --timeout"
    # The same from the environment, and mapped to one code for every client failure.
    mapped = _cli(silent_portal, "gpp_x", "status", "1", GPUPORTAL_TIMEOUT="1", GPUPORTAL_CLIENT_ERROR_CODE="1")
    assert mapped.returncode == 1 and "did not answer within 1 s" in mapped.stderr
    flag = _cli(silent_portal, "gpp_x", "--timeout", "1", "--client-error-code", "3", "status", "1")
    assert flag.returncode == 3


def test_client_failures_have_their_own_codes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connections are refused
        refused = _cli(closed, "gpp_x", "--timeout", "3", "cancel", "1")  # a POST: not retried
    assert refused.returncode == gpuportal.EXIT_UNREACHABLE == 202
    assert refused.stderr.strip().splitlines() == [f"gpuportal: error: cannot reach {closed}: Connection refused"]

    usage = _cli(closed, "gpp_x", "status", "not-a-number")
    assert usage.returncode == gpuportal.EXIT_USAGE == 200
    assert _cli(closed, "gpp_x", "--client-error-code=1", "status", "x").returncode == 1
    assert _cli(closed, "", "status", "1").returncode == 200  # no token


@pytest.fixture
def stack(tmp_path: Path, alice: Any, vision: Any, make_token: Any) -> Iterator[Stack]:
    from apps.jobs.models import ContainerImage

    ContainerImage.objects.create(name=PROCESS_IMAGE, description="local processes")
    running = start_stack(tmp_path, user=alice, make_token=make_token, runtime="process", gpus=2)
    yield running
    running.stop()


def _pid_alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_cancelled_pipeline_cancels_the_job(stack: Stack, tmp_path: Path, signum: signal.Signals) -> None:
    """What GitLab, Jenkins, Kubernetes and GitHub Actions do on cancel: SIGTERM (or SIGHUP) to `submit --wait`."""
    pid_file = tmp_path / f"job-{signum.name}.pid"
    script = f"echo $$ > {pid_file}; echo started; exec sleep 600"
    argv = [sys.executable, "-m", "cli.gpuportal", "submit", "--team", "vision", "--image", PROCESS_IMAGE]
    argv += ["--max-duration", "900", "--wait", "--", "sh", "-c", script]
    out, err = tmp_path / "cli.out", tmp_path / "cli.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        ci_step = subprocess.Popen(
            argv, stdout=stdout, stderr=stderr, env=_cli_env(stack.server.url, stack.api_token), text=True
        )
        try:
            # The job runs and its output streams to the step's log.
            wait_for(lambda: "started" in out.read_text(), 90, "the job's first line", stack.procs)
            job_pid = int(pid_file.read_text())
            assert _pid_alive(job_pid)
            ci_step.send_signal(signum)
            code = ci_step.wait(60)
        finally:
            if ci_step.poll() is None:
                ci_step.kill()
                ci_step.wait()
    messages = err.read_text()
    job_id = int(messages.split("gpuportal: job ", 1)[1].split()[0])
    assert code == 130, messages
    assert f"gpuportal: {signum.name} received: cancelling job {job_id}" in messages
    # No job left running: the portal says cancelled, and its process is gone from the node.
    final = stack.wait_state(job_id, {"succeeded", "failed", "cancelled", "lost"}, timeout=60)
    assert final["state"] == "cancelled", final
    wait_for(lambda: not _pid_alive(job_pid), 30, "the job's process to end", stack.procs)
    # The final status line once.
    assert messages.count(f"job {job_id} cancelled") <= 1, messages
    assert "Traceback" not in messages


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_the_final_status_line_is_printed_once(stack: Stack) -> None:
    done = _cli(
        stack.server.url,
        stack.api_token,
        "submit",
        "--team",
        "vision",
        "--image",
        PROCESS_IMAGE,
        "--wait",
        "--",
        "sh",
        "-c",
        "echo out; exit 3",
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["out"]
    finals = [line for line in done.stderr.splitlines() if " failed " in line or line.endswith(" failed")]
    assert len(finals) == 1, done.stderr
    assert finals[0].startswith("gpuportal: job ") and "exit 3" in finals[0]
