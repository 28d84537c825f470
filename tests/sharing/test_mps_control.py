"""The MPS control daemon's limits for jobs on shares (workers/gpu/mps.py, workers/agent_jobs.JobRunner).

There is no NVIDIA driver here, so ``nvidia-cuda-mps-control`` is a stand-in program with the real one's interface:
one command per invocation on standard input, ``get_server_list`` answered with server PIDs, a refused command
answered with a line starting "Error". Everything else is real: the agent's job runner runs the job as a real
process with the local-process runtime, and the stand-in records what it was told and when.
"""

from __future__ import annotations

import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.test_agent_jobs import RecordingSender, request
from workers.agent_jobs import JobRunner
from workers.gpu.mps import MpsControl, MpsError
from workers.runtimes.base import RuntimeEvents
from workers.runtimes.policy import ContainerPolicy
from workers.runtimes.process import ProcessRuntime

pytestmark = pytest.mark.timeout(60)

STAND_IN = """\
import os, sys, time
line = sys.stdin.readline().strip()
with open(os.environ["MPS_STAND_IN_LOG"], "a") as log:
    log.write(f"{time.time():.6f} {os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '-')} {line}\\n")
if line == "get_server_list":
    print("4242")
elif os.environ.get("MPS_STAND_IN_REFUSE") and line.startswith("set_"):
    print("Error: the value is out of range")
"""


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(f"#!{sys.executable}\n{STAND_IN}")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("MPS_STAND_IN_LOG", str(log))
    yield binary, log


def _commands(log: Path) -> list[str]:
    return [line.split(" ", 2)[2] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_share_sets_the_device_limit_on_running_servers_and_as_the_default(control: tuple[Path, Path]) -> None:
    binary, log = control
    mps = MpsControl(str(binary), pipe_dir="/run/nvidia-mps")
    sent = mps.limit_share(2, 20480, 25)

    assert sent == [
        "set_default_device_pinned_mem_limit 2 20480M",
        "set_default_active_thread_percentage 25",
        "set_device_pinned_mem_limit 4242 2 20480M",
        "set_active_thread_percentage 4242 25",
    ]
    assert _commands(log) == ["get_server_list", *sent]
    assert {line.split()[1] for line in log.read_text().splitlines()} == {"/run/nvidia-mps"}
    # The thread percentage is per server: it only rises to the largest share started (jobs lower their own).
    assert mps.limit_share(0, 40960, 50)[1] == "set_default_active_thread_percentage 50"
    assert mps.limit_share(2, 20480, 25)[1] == "set_default_active_thread_percentage 50"


def test_a_refusal_or_a_missing_daemon_is_an_error_that_says_why(
    control: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, _ = control
    monkeypatch.setenv("MPS_STAND_IN_REFUSE", "1")
    with pytest.raises(MpsError, match="out of range"):
        MpsControl(str(binary)).limit_share(0, 20480, 25)
    with pytest.raises(MpsError, match="no-such-mps-control"):
        MpsControl(str(tmp_path / "no-such-mps-control")).limit_share(0, 20480, 25)
    with pytest.raises(MpsError):
        MpsControl(str(binary)).limit_share(0, 0, 25)


def _runner(tmp_path: Path, binary: Path) -> tuple[JobRunner, RecordingSender]:
    sender = RecordingSender()
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=["GPU-0001", "GPU-0002"], mps=True)

    def factory(events: RuntimeEvents) -> ProcessRuntime:
        return ProcessRuntime(state_dir=tmp_path / "state", events=events, timeout_grace_s=0.5)

    runner = JobRunner(
        sender=sender,
        policy=policy,
        runtime_factory=factory,
        mps=MpsControl(str(binary)),
        gpu_index={"GPU-0001": 0, "GPU-0002": 1},
        gpu_memory={"GPU-0001": 81920, "GPU-0002": 81920},
    )
    runner.start()
    return runner, sender


def test_the_agent_sets_the_limits_before_a_share_job_starts(control: tuple[Path, Path], tmp_path: Path) -> None:
    binary, log = control
    runner, sender = _runner(tmp_path, binary)
    try:
        wanted = "$GPUPORTAL_GPU_ISOLATION $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
        script = f'date +%s.%N; echo "{wanted}"'
        body = request(31, "sh", "-c", script, gpu_uuids=["GPU-0002"], gpu_share=0.25, gpu_memory_mib=20480)
        assert runner.launch(body)
        assert sender.exit_of(31)["state"] == "succeeded"
        started_at, limits = (text for _, _, text in sender.lines_of(31))
        assert limits == "mps 0=20480M 25"
        assert _commands(log) == [
            "get_server_list",
            "set_default_device_pinned_mem_limit 1 20480M",
            "set_default_active_thread_percentage 25",
            "set_device_pinned_mem_limit 4242 1 20480M",
            "set_active_thread_percentage 4242 25",
        ]
        last_command_at = float(log.read_text().splitlines()[-1].split()[0])
        assert last_command_at <= float(started_at)

        # A whole GPU is the job's alone: nothing to limit.
        before = len(_commands(log))
        assert runner.launch(request(32, "true", gpu_uuids=["GPU-0001"]))
        assert sender.exit_of(32)["state"] == "succeeded"
        assert len(_commands(log)) == before
    finally:
        runner.stop()


def test_a_whole_gpu_job_after_shares_gets_the_gpus_memory_back(control: tuple[Path, Path], tmp_path: Path) -> None:
    """A split GPU taken whole (all its shares free): the daemon's per-device default still says one share's
    memory, and the whole-GPU job's clients would get only that; the agent lifts it to the GPU's memory first."""
    binary, log = control
    runner, sender = _runner(tmp_path, binary)
    try:
        body = request(41, "true", gpu_uuids=["GPU-0002"], gpu_share=0.25, gpu_memory_mib=20480)
        assert runner.launch(body)
        assert sender.exit_of(41)["state"] == "succeeded"
        before = len(_commands(log))
        assert runner.launch(request(42, "sh", "-c", 'echo "[$GPUPORTAL_GPU_SHARE]"', gpu_uuids=["GPU-0002"]))
        assert sender.exit_of(42)["state"] == "succeeded"
        assert [text for _, _, text in sender.lines_of(42)] == ["[]"]  # told nothing of shares
        assert _commands(log)[before:] == [
            "get_server_list",
            "set_default_device_pinned_mem_limit 1 81920M",
            "set_default_active_thread_percentage 100",
            "set_device_pinned_mem_limit 4242 1 81920M",
            "set_active_thread_percentage 4242 100",
        ]
        # Lifted once: the next whole-GPU job there, and one on a GPU never limited, send nothing.
        before = len(_commands(log))
        assert runner.launch(request(43, "true", gpu_uuids=["GPU-0002"]))
        assert runner.launch(request(44, "true", gpu_uuids=["GPU-0001"]))
        assert sender.exit_of(43)["state"] == "succeeded" and sender.exit_of(44)["state"] == "succeeded"
        assert len(_commands(log)) == before
    finally:
        runner.stop()


def test_a_quarter_beside_a_half_does_not_lower_the_halfs_limit(control: tuple[Path, Path], tmp_path: Path) -> None:
    """The daemon's memory limit is per device: while a job on half the GPU runs, a quarter started beside it keeps
    the default at the half's memory (its own variable lowers its clients to the quarter); once the half has ended,
    the next quarter brings the default down to a quarter's."""
    binary, log = control
    release = tmp_path / "release"
    runner, sender = _runner(tmp_path, binary)

    def limits_sent(since: int) -> list[str]:
        return [c for c in _commands(log)[since:] if c.startswith("set_default_device_pinned_mem_limit")]

    try:
        wait = f"while [ ! -e {release} ]; do sleep 0.05; done"
        assert runner.launch(request(51, "sh", "-c", wait, gpu_uuids=["GPU-0002"], gpu_share=0.5, gpu_memory_mib=40960))
        assert limits_sent(0) == ["set_default_device_pinned_mem_limit 1 40960M"]
        before = len(_commands(log))
        script = 'echo "$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"'
        assert runner.launch(
            request(52, "sh", "-c", script, gpu_uuids=["GPU-0002"], gpu_share=0.25, gpu_memory_mib=20480)
        )
        assert sender.exit_of(52)["state"] == "succeeded"
        assert [text for _, _, text in sender.lines_of(52)] == ["0=20480M"]  # the quarter's own clients: a quarter
        assert limits_sent(before) == ["set_default_device_pinned_mem_limit 1 40960M"]  # the half's stays
        release.touch()
        assert sender.exit_of(51)["state"] == "succeeded"
        before = len(_commands(log))
        assert runner.launch(request(53, "true", gpu_uuids=["GPU-0002"], gpu_share=0.25, gpu_memory_mib=20480))
        assert sender.exit_of(53)["state"] == "succeeded"
        assert limits_sent(before) == ["set_default_device_pinned_mem_limit 1 20480M"]
    finally:
        runner.stop()


def test_a_share_job_whose_limits_the_daemon_refuses_does_not_run(
    control: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, _ = control
    monkeypatch.setenv("MPS_STAND_IN_REFUSE", "1")
    marker = tmp_path / "ran"
    runner, sender = _runner(tmp_path, binary)
    try:
        body = request(33, "touch", str(marker), gpu_uuids=["GPU-0001"], gpu_share=0.5, gpu_memory_mib=40960)
        assert not runner.launch(body)
        report = sender.exit_of(33)
        assert (report["state"], report["reason"]) == ("failed", "launch_error")
        assert "MPS limits could not be set" in report["message"] and "out of range" in report["message"]
        time.sleep(0.3)
        assert not marker.exists()
        assert sender.of("jobs.report_started") == []
    finally:
        runner.stop()
