"""ProcessRuntime with real subprocesses (sh, sleep and this interpreter)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import EventRecorder
from workers.runtimes.base import JobOutcome, LaunchSpec, RuntimeEvents
from workers.runtimes.process import ProcessRuntime

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., ProcessRuntime]


@pytest.fixture
def process_runtime(process_state_dir: Path, recorder: EventRecorder) -> Iterator[MakeRuntime]:
    made: list[ProcessRuntime] = []

    def make(**kwargs: Any) -> ProcessRuntime:
        options: dict[str, Any] = {"state_dir": process_state_dir, "events": recorder.events, "timeout_grace_s": 1.0}
        options.update(kwargs)
        runtime = ProcessRuntime(**options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()
    # Whatever a test left running dies with it. A job's state file goes after its exit is reported, so one the
    # test saw end may vanish between the glob and the read.
    for path in process_state_dir.glob("job-*.json"):
        try:
            pid = json.loads(path.read_text()).get("pid")
        except FileNotFoundError:
            continue
        if pid:
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def spec(job_id: int, *command: str, **fields: Any) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, image="", command=list(command), **fields)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    # Another process changes the state here; there is nothing to subscribe to.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout}s")


def test_job_succeeds_with_ordered_logs_and_only_its_gpus(
    process_runtime: MakeRuntime, recorder: EventRecorder, process_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PORTAL_NODE_TOKEN", "secret")  # the agent's own credentials must not leak into jobs
    runtime = process_runtime()
    script = (
        'for i in 1 2 3; do echo "line-$i"; done; echo "oops" >&2; '
        'echo "cuda=$CUDA_VISIBLE_DEVICES token=${PORTAL_NODE_TOKEN:-none} mine=$MINE"'
    )
    assert runtime.launch(spec(201, "sh", "-c", script, env={"MINE": "yes"}, gpu_uuids=["GPU-a", "GPU-b"]))

    outcome = recorder.wait_exit(201)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("succeeded", "exit_code", 0)
    assert recorder.lines(201) == ["line-1", "line-2", "line-3", "cuda=GPU-a,GPU-b token=none mine=yes"]
    assert recorder.lines(201, "stderr") == ["oops"]
    assert recorder.started[201].startswith("pid:")
    wait_until(lambda: not list(process_state_dir.iterdir()))  # state and log files go after the report


def test_nonzero_exit_code_fails_the_job(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    process_runtime().launch(spec(202, "sh", "-c", "exit 3"))

    outcome = recorder.wait_exit(202)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 3)


def test_allocation_beyond_the_memory_limit_reads_as_oom(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = process_runtime()
    runtime.launch(spec(203, sys.executable, "-c", "b = bytearray(1 << 30)", memory_mib=256))

    outcome = recorder.wait_exit(203)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "oom", 1)
    assert any("MemoryError" in line for line in recorder.lines(203, "stderr"))


def test_the_job_runs_under_the_address_space_limit_it_asked_for(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = process_runtime()
    runtime.launch(spec(207, "sh", "-c", "ulimit -S -v; ulimit -H -v; grep 'Max address space' /proc/self/limits",
                        memory_mib=256))  # fmt: skip

    assert recorder.wait_exit(207).state == "succeeded"
    soft, hard, limits = recorder.lines(207)
    assert (soft, hard) == (str(256 * 1024), str(256 * 1024))
    assert limits.split()[3:6] == [str(256 << 20), str(256 << 20), "bytes"]


def test_the_launch_needs_no_code_in_the_child(
    process_runtime: MakeRuntime, recorder: EventRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A preexec_fn would make Python fork the whole agent (3.7 ms of CPU per job) instead of vfork (0.1 ms).
    import subprocess

    seen: list[Any] = []
    original = subprocess.Popen.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs.get("preexec_fn"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", recording)
    runtime = process_runtime()
    runtime.launch(spec(208, "true", memory_mib=64))
    assert recorder.wait_exit(208).state == "succeeded"
    assert seen == [None]


def test_a_limit_the_wrapper_cannot_set_fails_the_job_with_125(tmp_path: Path) -> None:
    import resource
    import subprocess

    from workers.runtimes.process import _SHELL, _WRAPPER

    exit_file = tmp_path / "exit"
    one_gib = 1 << 30

    def lower_hard_limit() -> None:  # the test's own child, not the runtime's
        resource.setrlimit(resource.RLIMIT_AS, (one_gib, one_gib))

    done = subprocess.run(
        [_SHELL, "-c", _WRAPPER, "gpuportal-job", str(exit_file), str(2 * one_gib // 1024), "echo", "ran"],
        capture_output=True, text=True, preexec_fn=lower_hard_limit, check=False, timeout=10,
    )  # fmt: skip
    assert done.returncode == 125
    assert done.stdout == ""  # the job did not run without its limit
    assert exit_file.read_text() == "125\n"


def test_gpu_jobs_get_no_address_space_limit(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    # CUDA reserves far more virtual memory than it uses; RLIMIT_AS would break every GPU job.
    runtime = process_runtime()
    runtime.launch(spec(204, "sh", "-c", "ulimit -v", memory_mib=256, gpu_uuids=["GPU-a"]))

    assert recorder.wait_exit(204).state == "succeeded"
    assert recorder.lines(204) == ["unlimited"]


def test_job_past_max_duration_is_stopped_as_timeout(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    began = time.monotonic()
    process_runtime().launch(spec(205, "sleep", "30", max_duration_s=1))

    outcome = recorder.wait_exit(205)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "timeout", 143)
    assert time.monotonic() - began < 5


def test_cancelled_job_that_handles_sigterm_exits_within_grace(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = process_runtime()
    runtime.launch(spec(206, "sh", "-c", 'trap "echo got-term; exit 0" TERM; echo ready; sleep 30 & wait'))
    recorder.wait_line(206, "ready")

    began = time.monotonic()
    assert runtime.stop(206, grace_s=10)
    outcome = recorder.wait_exit(206)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("cancelled", "cancelled", 0)
    assert "got-term" in recorder.lines(206)
    assert time.monotonic() - began < 5


def test_cancelled_job_that_ignores_sigterm_is_killed_after_grace(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = process_runtime()
    runtime.launch(spec(207, "sh", "-c", 'trap "" TERM; echo ready; sleep 30'))
    recorder.wait_line(207, "ready")

    began = time.monotonic()
    assert runtime.stop(207, grace_s=1)
    outcome = recorder.wait_exit(207)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("cancelled", "cancelled", 137)
    assert 0.9 <= time.monotonic() - began < 5


def test_missing_executable_is_a_launch_error(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    process_runtime().launch(spec(208, "/nonexistent/train", "--epochs", "1"))

    outcome = recorder.wait_exit(208)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "launch_error", None)
    assert "/nonexistent/train" in outcome.message
    assert 208 not in recorder.started


def test_long_lines_are_cut_into_bounded_pieces(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = process_runtime(max_line_bytes=1000)
    runtime.launch(spec(209, sys.executable, "-c", "print('a' * 2500); print('end')"))

    recorder.wait_exit(209)

    assert [len(line) for line in recorder.lines(209)] == [1000, 1000, 500, 3]


def test_lines_arrive_while_the_job_runs_from_one_watcher_thread(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = process_runtime()
    runtime.launch(spec(220, "sh", "-c", "echo ready; echo warming >&2; sleep 30"))

    recorder.wait_line(220, "ready", timeout=10)
    recorder.wait_line(220, "warming", timeout=10)
    assert 220 not in recorder.outcomes  # streamed, not collected at the exit
    # One thread waits for the process and reads both files: no reader thread per file.
    names = [t.name for t in threading.enumerate() if t.name.startswith("process-") and t.name.endswith("-220")]
    assert names == ["process-job-220"]

    runtime.stop(220, grace_s=0)
    assert recorder.wait_exit(220).state == "cancelled"


def test_a_flood_of_output_arrives_whole_and_in_order(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    # ~9 MiB, more than one wake-up reads of a file (4 MiB): the rest is read at once, nothing is lost or repeated.
    runtime = process_runtime()
    program = (
        "import sys\nfor i in range(120000): sys.stdout.write(f'{i:08d}' + 'x' * 70 + '\\n')\n"
        "print('done', file=sys.stderr)"
    )
    runtime.launch(spec(221, sys.executable, "-c", program))

    outcome = recorder.wait_exit(221, timeout=60)

    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)
    out = [line for stream, line in recorder.logs[221] if stream == "stdout"]
    assert len(out) == 120000
    assert [int(line[:8]) for line in out] == list(range(120000))
    assert [line for stream, line in recorder.logs[221] if stream == "stderr"] == ["done"]


def test_duplicate_launch_and_unknown_stop(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = process_runtime()
    assert runtime.launch(spec(210, "sleep", "30"))
    assert runtime.launch(spec(210, "sleep", "30")) is False
    assert runtime.stop(999_999) is False
    recorder.wait_started(210)
    runtime.stop(210, grace_s=0)
    assert recorder.wait_exit(210).state == "cancelled"


def test_restarted_agent_finds_and_adopts_a_running_process(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    before_restart = process_runtime()
    before_restart.launch(
        spec(211, "sh", "-c", "echo before; sleep 1.5; echo after; exit 4", gpu_uuids=["MIG-x"], gpu_memory_mib=0)
    )
    recorder.wait_line(211, "before")
    before_restart.close()

    after_restart = process_runtime()
    (listed,) = after_restart.list_jobs()
    assert (listed.job_id, listed.status, listed.watched) == (211, "running", False)
    assert listed.gpu_uuids == ("MIG-x",)  # from the state file: a restarted agent still knows its devices
    assert after_restart.launch(spec(211, "true")) is False  # found on the host: adopt, never start twice
    assert after_restart.adopt(211)

    outcome = recorder.wait_exit(211)

    # Not our child, but the wrapper it runs under wrote how it ended.
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 4)
    assert outcome.message == "exited with code 4"
    assert recorder.lines(211) == ["before", "after"]
    wait_until(lambda: after_restart.list_jobs() == [])


def test_adopted_process_can_be_cancelled(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    before_restart = process_runtime()
    before_restart.launch(spec(212, "sleep", "30"))
    recorder.wait_started(212)
    before_restart.close()

    after_restart = process_runtime()
    assert after_restart.stop(212, grace_s=1)  # adopts, then stops

    outcome = recorder.wait_exit(212)
    assert (outcome.state, outcome.reason) == ("cancelled", "cancelled"), outcome


def test_process_that_ended_unwatched_is_listed_as_exited_with_its_code(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    before_restart = process_runtime()
    before_restart.launch(spec(213, "sh", "-c", "sleep 0.3; exit 5"))
    recorder.wait_started(213)
    before_restart.close()

    after_restart = process_runtime()
    wait_until(lambda: after_restart.list_jobs()[0].status == "exited")
    (listed,) = after_restart.list_jobs()
    assert listed.exit_code == 5

    assert after_restart.adopt(213)
    outcome = recorder.wait_exit(213)
    assert (outcome.state, outcome.exit_code) == ("failed", 5)
    assert "while no agent watched it" in outcome.message


def test_an_adopted_success_succeeds_and_a_group_killed_whole_stays_unknown(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    before_restart = process_runtime()
    before_restart.launch(spec(215, "sh", "-c", "sleep 1; echo done"))
    before_restart.launch(spec(216, "sleep", "30"))
    recorder.wait_started(215)
    recorder.wait_started(216)
    before_restart.close()

    after_restart = process_runtime()
    assert after_restart.adopt(215) and after_restart.adopt(216)
    outcome = recorder.wait_exit(215)
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("succeeded", "exit_code", 0)

    # SIGKILL to the whole group (not by this agent) leaves no status to read: said, not guessed.
    pid = json.loads((after_restart._state_path(216)).read_text())["pid"]
    os.killpg(pid, 9)
    outcome = recorder.wait_exit(216)
    assert (outcome.state, outcome.exit_code) == ("failed", None)
    assert "unknown" in outcome.message


def test_a_program_named_like_a_shell_builtin_is_the_program(
    process_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    # dash's builtin echo would turn "\\n" into a newline; /bin/echo prints it as given.
    process_runtime().launch(spec(217, "echo", "a\\nb"))
    assert recorder.wait_exit(217).state == "succeeded"
    assert recorder.lines(217) == ["a\\nb"]


def test_outcome_whose_report_failed_is_found_again(process_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    def broken_report(outcome: JobOutcome) -> None:
        raise ConnectionError("broker down")

    before_restart = process_runtime(events=RuntimeEvents(on_exit=broken_report))
    before_restart.launch(spec(214, "sh", "-c", "exit 6"))
    wait_until(lambda: [(j.status, j.exit_code) for j in before_restart.list_jobs()] == [("exited", 6)])
    before_restart.close()

    after_restart = process_runtime()
    assert after_restart.adopt(214)
    outcome = recorder.wait_exit(214)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 6)
