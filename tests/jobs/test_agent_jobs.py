"""The agent's job runner (workers/agent_jobs.py) with the real local-process runtime and a recording sender:
reports, batched logs, cancellation, node policy, restart reconciliation. No portal involved."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.agent_jobs import JobRunner, node_policy, resolve_runtime_kind
from workers.runtimes.base import RuntimeEvents
from workers.runtimes.policy import ContainerPolicy
from workers.runtimes.process import ProcessRuntime

pytestmark = pytest.mark.timeout(60)


class RecordingSender:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.cond = threading.Condition()

    def send(self, task: str, body: dict[str, Any], *, expires: float | None = None, critical: bool = True) -> None:
        with self.cond:
            self.sent.append((task, body))
            self.cond.notify_all()

    def pending(self) -> int:
        return 0

    def of(self, task: str) -> list[dict[str, Any]]:
        with self.cond:
            return [body for t, body in self.sent if t == task]

    def wait(self, predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; sent: {[t for t, _ in self.sent]}")
                self.cond.wait(min(left, 0.1))

    def exit_of(self, job_id: int) -> dict[str, Any]:
        return self.wait(lambda: next((b for b in self.of("jobs.report_exit") if b["job_id"] == job_id), None))

    def lines_of(self, job_id: int) -> list[tuple[int, str, str]]:
        out = []
        for body in self.of("jobs.report_logs"):
            for batch in body["batches"]:
                if batch["job_id"] == job_id:
                    out.extend((batch["first"] + i, s, text) for i, (s, text, _) in enumerate(batch["lines"]))
        return out


POLICY = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=["GPU-0001", "GPU-0002"])


@pytest.fixture
def make_runner(tmp_path: Path) -> Iterator[Callable[..., tuple[JobRunner, RecordingSender]]]:
    made: list[JobRunner] = []

    def make(policy: ContainerPolicy = POLICY, on_gpus: Any = None) -> tuple[JobRunner, RecordingSender]:
        sender = RecordingSender()

        def factory(events: RuntimeEvents) -> ProcessRuntime:
            return ProcessRuntime(state_dir=tmp_path / "state", events=events, timeout_grace_s=0.5)

        runner = JobRunner(sender=sender, policy=policy, runtime_factory=factory, on_gpus=on_gpus)
        runner.start()
        made.append(runner)
        return runner, sender

    yield make
    for runner in made:
        runner.stop()


def request(job_id: int, *argv: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "image": "local/process", "command": list(argv), "env": {}, "gpu_uuids": ["GPU-0001"],
            "cpus": 1.0, "memory_mib": 0, "max_duration_s": 30, "mounts": [], "network": "none", **extra}  # fmt: skip


def test_a_job_reports_started_logs_in_order_and_its_exit(make_runner):
    runner, sender = make_runner()
    script = 'for i in $(seq 1 120); do echo "line-$i"; done; echo oops >&2; exit 3'
    assert runner.launch(request(11, "sh", "-c", script, env={"GREETING": "hi"}))

    exit_report = sender.exit_of(11)
    assert (exit_report["state"], exit_report["reason"], exit_report["exit_code"]) == ("failed", "exit_code", 3)
    # The start is reported on its own, or (a job this short) inside the exit report.
    started = sender.of("jobs.report_started")
    handle = started[0]["handle"] if started else exit_report["handle"]
    assert handle.startswith("pid:")
    assert started or exit_report["started_at"] <= exit_report["finished_at"]
    lines = sender.lines_of(11)
    stdout = [text for _, s, text in lines if s == "stdout"]
    assert stdout == [f"line-{i}" for i in range(1, 121)]
    assert [text for _, s, text in lines if s == "stderr"] == ["oops"]
    assert sorted(seq for seq, _, _ in lines) == list(range(1, 122))  # numbered without gaps
    assert exit_report["log_total"] == 121
    # Batched: 121 lines went out in a handful of messages, not one per line.
    assert len(sender.of("jobs.report_logs")) < 20


def test_a_longer_job_reports_its_start_before_its_end(make_runner):
    runner, sender = make_runner()
    runner.launch(request(19, "sh", "-c", "sleep 1.5"))
    sender.wait(lambda: sender.of("jobs.report_started"))
    assert not sender.of("jobs.report_exit")
    report = sender.exit_of(19)
    assert "started_at" not in report


def test_a_quiet_short_job_costs_the_portal_one_message(make_runner):
    """Shorter than START_REPORT_DELAY_S and silent: its start rides in the exit report, nothing else is sent."""
    runner, sender = make_runner()
    runner.launch(request(20, "sleep", "0.1"))
    report = sender.exit_of(20)
    time.sleep(0.3)  # a start report that was coming anyway would be out by now (flushes every 0.2 s)
    assert [task for task, _ in sender.sent] == ["jobs.report_exit"]
    assert report["state"] == "succeeded" and report["handle"].startswith("pid:")
    assert report["started_at"] <= report["finished_at"]


def test_a_job_that_prints_reports_its_start_before_its_lines(make_runner):
    runner, sender = make_runner()
    runner.launch(request(21, "sh", "-c", "echo first; sleep 2; echo second"))
    sender.wait(lambda: sender.lines_of(21))
    tasks = [task for task, body in sender.sent if body.get("job_id") == 21 or task == "jobs.report_logs"]
    assert tasks[:2] == ["jobs.report_started", "jobs.report_logs"]
    assert "started_at" not in sender.exit_of(21)


def test_cancel_sends_sigterm_then_reports_cancelled(make_runner):
    runner, sender = make_runner()
    script = "trap 'echo got-term; exit 143' TERM; echo ready; while true; do sleep 0.1; done"
    runner.launch(request(12, "sh", "-c", script))
    sender.wait(lambda: any(text == "ready" for _, _, text in sender.lines_of(12)))
    assert runner.cancel(12, grace_s=5)
    report = sender.exit_of(12)
    assert (report["state"], report["reason"]) == ("cancelled", "cancelled")
    assert "got-term" in [text for _, _, text in sender.lines_of(12)]


def test_stop_jobs_cancels_every_running_job_and_waits_for_their_exits(make_runner):
    """`--stop-jobs-on-exit` (make run's local agent): the agent's shutdown takes its jobs with it."""
    runner, sender = make_runner()
    for job_id in (31, 32):
        runner.launch(request(job_id, "sh", "-c", "echo ready; while true; do sleep 0.1; done"))
    sender.wait(lambda: all(sender.lines_of(j) for j in (31, 32)))
    pids = [int(runner.runtime.list_jobs()[i].handle.removeprefix("pid:")) for i in range(2)]

    assert runner.stop_jobs(grace_s=1) == [31, 32]

    for job_id in (31, 32):  # reported before stop_jobs returned
        assert [b["reason"] for b in sender.of("jobs.report_exit") if b["job_id"] == job_id] == ["cancelled"]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_cancel_before_launch_reports_cancelled_and_the_launch_is_ignored(make_runner):
    runner, sender = make_runner()
    assert not runner.cancel(13, grace_s=1)
    assert sender.exit_of(13)["state"] == "cancelled"
    assert not runner.launch(request(13, "sh", "-c", "echo should-not-run"))
    time.sleep(0.5)
    assert sender.lines_of(13) == []


def test_timeout_is_reported(make_runner):
    runner, sender = make_runner()
    runner.launch(request(14, "sleep", "30", max_duration_s=1))
    report = sender.exit_of(14)
    assert (report["state"], report["reason"]) == ("failed", "timeout")


@pytest.mark.parametrize(
    "change",
    [
        {"privileged": True},
        {"command": "echo hi"},
        {"gpu_uuids": ["GPU-not-here"]},
        {"mounts": [{"host_path": "/etc", "container_path": "/etc"}]},
        {"network": "host"},
        {"cap_add": ["SYS_ADMIN"]},
    ],
)
def test_the_node_policy_refuses_what_the_portal_should_never_have_sent(make_runner, change):
    runner, sender = make_runner()
    assert not runner.launch({**request(15, "echo", "hi"), **change})
    report = sender.exit_of(15)
    assert (report["state"], report["reason"]) == ("failed", "launch_error")
    assert "policy" in report["message"]
    assert sender.of("jobs.report_started") == []


def test_an_unknown_program_is_a_launch_error(make_runner):
    runner, sender = make_runner()
    runner.launch(request(16, "/no/such/program"))
    report = sender.exit_of(16)
    assert (report["state"], report["reason"]) == ("failed", "launch_error")


def test_a_duplicate_launch_starts_nothing_twice(make_runner):
    runner, sender = make_runner()
    assert runner.launch(request(17, "sh", "-c", "echo once; sleep 0.3"))
    assert not runner.launch(request(17, "sh", "-c", "echo once; sleep 0.3"))
    sender.exit_of(17)
    assert [text for _, _, text in sender.lines_of(17)] == ["once"]


def test_a_restarted_runner_adopts_a_running_job_and_reports_its_end(make_runner):
    first, first_sender = make_runner()
    first.launch(request(18, "sh", "-c", "echo before; sleep 1.5; echo after", gpu_share=0.25, gpu_memory_mib=20480))
    first_sender.wait(lambda: first_sender.lines_of(18))
    first.stop()  # the agent goes away; the process keeps running

    followed: list[tuple[int, list[str], bool, int]] = []
    second, sender = make_runner(on_gpus=lambda *call: followed.append(call))
    assert second.reconcile() == [18]
    (running,) = second.running_jobs()
    assert running.devices == ("GPU-0001",)  # its devices survive the restart (the memory attribution reads them)
    assert followed == [(18, ["GPU-0001"], True, 20480)]  # simulated GPUs follow it again, within its budget
    inventory = sender.of("jobs.report_inventory")[0]
    assert inventory["jobs"] == [{"job_id": 18, "status": "running"}]
    report = sender.exit_of(18)
    # An adopted process is not the new agent's child; the runtime's wrapper wrote its exit status.
    assert (report["state"], report["exit_code"]) == ("succeeded", 0)
    assert "after" in [text for _, _, text in sender.lines_of(18)]
    wait_for = time.monotonic() + 5
    while len(followed) < 2 and time.monotonic() < wait_for:
        time.sleep(0.02)
    assert followed[1] == (18, ["GPU-0001"], False, 0)


def test_runtime_choice():
    assert resolve_runtime_kind("process", "unix:///nowhere.sock") == "process"
    assert resolve_runtime_kind("auto", "unix:///nowhere.sock") == "process"
    with pytest.raises(ValueError):
        resolve_runtime_kind("podman", "")
    assert node_policy(["GPU-1"]).allowed_images == ("*",)


def test_the_inventory_lists_recent_exits_for_a_while(make_runner, monkeypatch):
    """A job that just ended is listed as exited (its exit report may reach the portal's worker after this
    inventory), then forgotten."""
    from workers import agent_jobs

    runner, sender = make_runner()
    runner.launch(request(19, "sh", "-c", "sleep 1"))
    sender.wait(lambda: runner.inventory() == [{"job_id": 19, "status": "running"}])
    sender.exit_of(19)
    assert runner.inventory() == [{"job_id": 19, "status": "exited"}]
    monkeypatch.setattr(agent_jobs, "EXITED_LISTED_S", 0.0)
    assert runner.inventory() == []


def test_running_jobs_name_their_devices_and_handles_for_the_memory_attribution(make_runner) -> None:
    from workers.gpu.base import GpuSample
    from workers.jobmem import JobMemory

    runner, sender = make_runner()
    assert runner.launch(request(41, "sh", "-c", "sleep 30 & echo child $!; wait"))
    child = int(sender.wait(lambda: [t for _, _, t in sender.lines_of(41)])[0].split()[1])
    (job,) = runner.running_jobs()
    assert (job.job_id, job.devices, job.handle.startswith("pid:")) == (41, ("GPU-0001",), True)
    sample = GpuSample("GPU-0001", 0.0, 0, 500, 81920, 30, 60.0, 210, processes=[(child, 500)])
    (out,) = JobMemory(runner.running_jobs).annotate([sample])
    assert out.job_memory == {41: 500}
    runner.cancel(41, 0.5)
    sender.exit_of(41)
    assert runner.running_jobs() == []


def test_simulated_gpus_follow_a_share_job_within_its_budget(make_runner) -> None:
    from types import SimpleNamespace

    from workers.agent_jobs import _simulated_gpus
    from workers.gpu.simulated import SimulatedBackend

    backend = SimulatedBackend("n1", ["A100-80GB"], seed=4)
    (gpu,) = backend.discover()
    follow = _simulated_gpus(SimpleNamespace(backend=backend, backend_kind="simulated"))  # type: ignore[arg-type]
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[gpu.uuid])
    runner, sender = make_runner(policy, on_gpus=follow)
    body = request(51, "sleep", "30", gpu_uuids=[gpu.uuid], gpu_share=0.25, gpu_memory_mib=20_480)
    assert runner.launch({**body, "env": {}})
    assert backend.assignment(gpu.uuid) is not None and backend.assignment(gpu.uuid)[0] == "job-51"
    backend.sample(time.time())
    (sample,) = backend.sample(time.time() + 11)  # a slow tick: per-process memory
    (pid_mib,) = sample.processes or []
    assert backend.job_of_pid(pid_mib[0]) == 51
    assert 0 < pid_mib[1] <= 20_480  # what it was told, not what its profile takes of a whole A100
    runner.cancel(51, 0.5)
    sender.exit_of(51)
    assert backend.assignment(gpu.uuid) is None
