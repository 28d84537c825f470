"""The pieces both runtimes share: line splitting, the GPU environment, outcome precedence, no Django."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest

from workers.runtimes.base import (
    LaunchSpec,
    LineSplitter,
    Runtime,
    gpu_env,
    outcome_from_exit,
    signal_exit_code,
)
from workers.runtimes.docker import engine_run_times, parse_engine_time
from workers.runtimes.process import ProcessRuntime


def test_lines_are_split_across_chunks_and_bounded() -> None:
    splitter = LineSplitter(max_bytes=4)
    lines = [*splitter.feed(b"ab"), *splitter.feed(b"c\nabcdefghij\r\n"), *splitter.feed(b"tail")]
    assert lines == ["abc", "abcd", "efgh", "ij", "tail"]
    assert list(splitter.flush()) == []
    assert list(LineSplitter().feed(b"\xff\xfebinary\n")) == ["\ufffd\ufffdbinary"]


def test_unflushed_partial_line_comes_out_at_the_end() -> None:
    splitter = LineSplitter()
    assert list(splitter.feed(b"no newline")) == []
    assert list(splitter.flush()) == ["no newline"]


def test_gpu_variables_always_come_from_the_assignment() -> None:
    env = gpu_env(LaunchSpec(1, "img", ["x"], env={"CUDA_VISIBLE_DEVICES": "all", "A": "1"}))
    assert env == {"A": "1", "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": ""}

    one = gpu_env(LaunchSpec(1, "img", ["x"], gpu_uuids=["GPU-a"]))
    assert one["CUDA_VISIBLE_DEVICES"] == "GPU-a" and "NCCL_ASYNC_ERROR_HANDLING" not in one


def test_multi_gpu_jobs_get_nccl_defaults_unless_they_set_them() -> None:
    spec = LaunchSpec(1, "img", ["x"], env={"NCCL_ASYNC_ERROR_HANDLING": "0"}, gpu_uuids=["GPU-a", "GPU-b"])
    env = gpu_env(spec)
    assert env["NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"


@pytest.mark.parametrize(
    ("exit_code", "stop_reason", "oom", "expected"),
    [
        (0, None, False, ("succeeded", "exit_code")),
        (2, None, False, ("failed", "exit_code")),
        (137, None, True, ("failed", "oom")),
        (0, None, True, ("succeeded", "exit_code")),  # a child was OOM-killed, the job recovered
        (137, "timeout", True, ("failed", "timeout")),
        (143, "cancelled", False, ("cancelled", "cancelled")),
        (None, None, False, ("failed", "exit_code")),
    ],
)
def test_outcome_precedence(
    exit_code: int | None, stop_reason: str | None, oom: bool, expected: tuple[str, str]
) -> None:
    outcome = outcome_from_exit(1, exit_code, stop_reason=stop_reason, oom=oom)  # type: ignore[arg-type]
    assert (outcome.state, outcome.reason, outcome.exit_code) == (*expected, exit_code)


def test_death_by_signal_reads_as_128_plus_signal() -> None:
    assert signal_exit_code(-9) == 137 and signal_exit_code(-15) == 143 and signal_exit_code(3) == 3


def test_engine_times_parse_to_aware_utc() -> None:
    parsed = parse_engine_time("2026-12-02T16:59:38.747231473Z")
    assert parsed == datetime(2026, 12, 2, 16, 59, 38, 747231, tzinfo=timezone.utc)  # noqa: UP017
    assert parse_engine_time("0001-01-01T00:00:00Z") is None
    assert parse_engine_time("") is None


def test_engine_finish_stamped_before_start_reads_as_the_start() -> None:
    # Seen on a real dockerd: a container that exits at once is stamped FinishedAt before StartedAt.
    started, finished = engine_run_times(
        {"StartedAt": "2026-12-03T12:09:07.595170001Z", "FinishedAt": "2026-12-03T12:09:07.594457001Z"}
    )
    assert started == finished == datetime(2026, 12, 3, 12, 9, 7, 595170, tzinfo=timezone.utc)  # noqa: UP017
    started, finished = engine_run_times({"StartedAt": "2026-12-03T12:00:00Z", "FinishedAt": "2026-12-03T12:00:05Z"})
    assert started is not None and finished is not None and (finished - started).total_seconds() == 5
    assert engine_run_times({"StartedAt": "0001-01-01T00:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z"}) == (None, None)


def test_runtimes_satisfy_the_protocol(tmp_path: object) -> None:
    assert isinstance(ProcessRuntime(state_dir=f"{tmp_path}/s"), Runtime)


def test_runtimes_import_without_django() -> None:
    # GPU nodes run the agent with plain Python: importing a runtime must not pull the portal in.
    code = (
        "import sys, workers.runtimes.base, workers.runtimes.policy, workers.runtimes.docker, "
        "workers.runtimes.process; sys.exit('django' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
