"""DockerRuntime against a real dockerd (tests/support/dockerd.py starts one) and the busybox test image."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.dockerd import IMAGE
from tests.workers.conftest import EventRecorder
from workers.runtimes.base import LaunchSpec, Mount
from workers.runtimes.docker import DockerRuntime

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

MakeRuntime = Callable[..., DockerRuntime]


def spec(job_id: int, *command: str, **fields: Any) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, image=IMAGE, command=list(command), **fields)


def containers_of(runtime: DockerRuntime, job_id: int) -> list[Any]:
    return runtime.client.containers.list(all=True, filters={"label": f"portal.job={job_id}"})


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    # The engine changes state on its own; there is nothing to subscribe to from here.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout}s")


def test_job_succeeds_and_its_logs_arrive_in_order(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    script = 'for i in 1 2 3 4 5; do echo "line-$i"; done; echo "to-stderr" >&2; echo "last"'
    assert runtime.launch(spec(101, "sh", "-c", script))

    outcome = recorder.wait_exit(101)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("succeeded", "exit_code", 0)
    assert recorder.lines(101) == ["line-1", "line-2", "line-3", "line-4", "line-5", "last"]
    assert recorder.lines(101, "stderr") == ["to-stderr"]
    assert recorder.started[101]  # the container id
    assert outcome.started_at is not None and outcome.finished_at is not None
    assert outcome.finished_at >= outcome.started_at
    # Read, reported, then removed (in that order: a crash in between re-reports rather than loses it).
    wait_until(lambda: containers_of(runtime, 101) == [])
    assert runtime.list_jobs() == []


def test_nonzero_exit_code_fails_the_job(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    runtime.launch(spec(102, "sh", "-c", "echo bye; exit 3"))

    outcome = recorder.wait_exit(102)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", 3)
    assert recorder.lines(102) == ["bye"]


def test_job_over_its_memory_limit_is_oom_killed(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    # busybox sh keeps a command substitution's whole output in memory: 100 MB of 'a' under a 16 MiB limit.
    hog = 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}'
    runtime.launch(spec(103, "sh", "-c", hog, memory_mib=16))

    outcome = recorder.wait_exit(103)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "oom", 137)
    assert "OOM" in outcome.message


def test_engine_event_log_tells_an_oom_kill_from_another_sigkill(docker_runtime: MakeRuntime) -> None:
    # What the runtime asks when dockerd's OOMKilled flag is missing (tests/workers/test_runtime_docker_oom_flag.py):
    # the real engine's event log, for a container the kernel OOM-killed and one whose shell SIGKILLed itself.
    runtime = docker_runtime()
    hog = 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}'
    made = []
    try:
        for command in (hog, "kill -9 $$"):
            container = runtime.client.containers.run(
                IMAGE, ["sh", "-c", command], detach=True, mem_limit="16m", memswap_limit="16m", init=True,
                network_mode="none",
            )  # fmt: skip
            made.append(container)
            assert container.wait(timeout=60)["StatusCode"] == 137
            container.reload()
        oom, other = made
        wait_until(lambda: runtime._oom_event_logged(oom))
        assert runtime._oom_killed(oom)
        assert not runtime._oom_event_logged(other)
        assert not runtime._oom_killed(other)
    finally:
        for container in made:
            container.remove(force=True)


def test_job_past_max_duration_is_stopped_as_timeout(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime(timeout_grace_s=1.0)
    began = time.monotonic()
    runtime.launch(spec(104, "sleep", "30", max_duration_s=1))

    outcome = recorder.wait_exit(104)

    assert (outcome.state, outcome.reason) == ("failed", "timeout")
    assert outcome.exit_code == 143  # docker-init (PID 1) passed SIGTERM on to sleep, which died of it
    assert time.monotonic() - began < 8


def test_cancelled_job_that_handles_sigterm_exits_within_grace(
    docker_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = docker_runtime()
    script = 'trap "echo got-term; exit 0" TERM; echo ready; sleep 30 & wait'
    runtime.launch(spec(105, "sh", "-c", script))
    recorder.wait_line(105, "ready")

    began = time.monotonic()
    assert runtime.stop(105, grace_s=10)
    outcome = recorder.wait_exit(105)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("cancelled", "cancelled", 0)
    assert "got-term" in recorder.lines(105)
    assert time.monotonic() - began < 5


def test_cancelled_job_that_ignores_sigterm_is_killed_after_grace(
    docker_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = docker_runtime()
    runtime.launch(spec(106, "sh", "-c", 'trap "" TERM; echo ready; sleep 30'))
    recorder.wait_line(106, "ready")

    began = time.monotonic()
    assert runtime.stop(106, grace_s=1)
    outcome = recorder.wait_exit(106)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("cancelled", "cancelled", 137)
    assert 0.9 <= time.monotonic() - began < 8
    wait_until(lambda: containers_of(runtime, 106) == [])


def test_stop_of_an_unknown_job_says_so(docker_runtime: MakeRuntime) -> None:
    assert docker_runtime().stop(999_999, grace_s=0) is False


def test_missing_image_is_a_quick_launch_error(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    began = time.monotonic()
    runtime.launch(LaunchSpec(job_id=107, image="portal-test/absent:1", command=["true"]))

    outcome = recorder.wait_exit(107, timeout=10)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "launch_error", None)
    assert "No such image" in outcome.message
    assert time.monotonic() - began < 3
    assert 107 not in recorder.started


def test_pull_missing_without_a_registry_fails_within_its_timeout(
    docker_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = docker_runtime(pull="missing", pull_timeout_s=3)
    began = time.monotonic()
    runtime.launch(LaunchSpec(job_id=108, image="registry.invalid/nobody/absent:1", command=["true"]))

    outcome = recorder.wait_exit(108, timeout=15)

    assert outcome.reason == "launch_error"
    assert "registry.invalid/nobody/absent:1" in outcome.message
    assert time.monotonic() - began < 8


def test_gpus_without_the_nvidia_runtime_is_a_launch_error_and_leaves_no_container(
    docker_runtime: MakeRuntime, recorder: EventRecorder
) -> None:
    runtime = docker_runtime()
    runtime.launch(spec(109, "true", gpu_uuids=["GPU-00000000-0000-0000-0000-000000000001"], use_nvidia_runtime=True))

    outcome = recorder.wait_exit(109)

    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "launch_error", None)
    assert "gpu" in outcome.message  # the engine's words: could not select device driver ... [[gpu]]
    assert containers_of(runtime, 109) == []


def test_container_is_locked_down_and_sees_only_its_gpus(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    gpus = ["GPU-aaaa", "GPU-bbbb"]
    job = spec(
        110,
        "sh",
        "-c",
        'echo "cuda=$CUDA_VISIBLE_DEVICES nv=$NVIDIA_VISIBLE_DEVICES nccl=$NCCL_ASYNC_ERROR_HANDLING"; sleep 30',
        # The runtime, not the job, decides the visible GPUs, even if a request slipped past the policy.
        env={"CUDA_VISIBLE_DEVICES": "all", "NVIDIA_VISIBLE_DEVICES": "all", "MY_SETTING": "x"},
        gpu_uuids=gpus,
        cpus=0.5,
        memory_mib=64,
    )
    assert runtime.launch(job)
    assert runtime.launch(job) is False  # a redelivered launch does not start a second copy
    recorder.wait_started(110)
    recorder.wait_line(110, "cuda=GPU-aaaa,GPU-bbbb nv=GPU-aaaa,GPU-bbbb nccl=1")

    (container,) = containers_of(runtime, 110)
    host = container.attrs["HostConfig"]
    assert host["Privileged"] is False
    assert not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 4096
    assert host["Memory"] == 64 * 1024 * 1024
    assert host["MemorySwap"] == 64 * 1024 * 1024  # no swap: OOM is real
    assert host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == "none"
    assert not host["Binds"] and not host.get("Mounts")
    assert not host["Ulimits"]
    assert not host["Devices"] and not host["DeviceRequests"]
    assert host["PidMode"] == "" and host["IpcMode"] in ("private", "shareable")
    env = container.attrs["Config"]["Env"]
    assert [e for e in env if e.startswith("CUDA_VISIBLE_DEVICES=")] == ["CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb"]
    assert "MY_SETTING=x" in env
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in env
    assert container.labels["portal.job"] == "110" and container.labels["portal.managed"] == "1"

    runtime.stop(110, grace_s=0)
    assert recorder.wait_exit(110).state == "cancelled"


def test_allowed_mount_is_readable_and_read_only(
    docker_runtime: MakeRuntime, recorder: EventRecorder, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("hello from the host\n")
    runtime = docker_runtime()
    script = "cat /data/in.txt; touch /data/new 2>/dev/null && echo wrote || echo read-only"
    runtime.launch(spec(111, "sh", "-c", script, mounts=[Mount(str(tmp_path), "/data", True)]))

    outcome = recorder.wait_exit(111)

    assert outcome.state == "succeeded"
    assert recorder.lines(111) == ["hello from the host", "read-only"]
    assert not (tmp_path / "new").exists()


def test_restarted_agent_adopts_a_running_job_and_reads_back_an_exited_one(
    docker_runtime: MakeRuntime, recorder: EventRecorder, dockerd: str
) -> None:
    before_restart = docker_runtime()
    before_restart.launch(
        spec(112, "sh", "-c", "echo before; sleep 2; echo after; exit 4", gpu_uuids=["GPU-aaaa"], gpu_memory_mib=20480)
    )
    before_restart.launch(spec(113, "sh", "-c", "sleep 0.3; exit 5"))
    recorder.wait_started(112)
    recorder.wait_started(113)
    recorder.wait_line(112, "before")
    before_restart.close()  # the agent dies; its containers keep running

    client = docker.DockerClient(base_url=dockerd, version="auto")
    try:
        wait_until(lambda: client.containers.list(all=True, filters={"label": "portal.job=113"})[0].status == "exited")
    finally:
        client.close()

    after_restart = docker_runtime()
    listed = {job.job_id: job for job in after_restart.list_jobs()}
    assert listed[112].status == "running" and listed[112].exit_code is None
    assert listed[113].status == "exited" and listed[113].exit_code == 5 and listed[113].oom_killed is False
    assert not listed[112].watched and not listed[113].watched
    # Its devices and memory budget come back from the container's labels (the agent's memory attribution).
    assert (listed[112].gpu_uuids, listed[112].gpu_memory_mib) == (("GPU-aaaa",), 20480)
    assert (listed[113].gpu_uuids, listed[113].gpu_memory_mib) == ((), 0)

    assert after_restart.adopt(112)
    assert after_restart.adopt(113)
    running = recorder.wait_exit(112)
    exited = recorder.wait_exit(113)

    assert (running.state, running.reason, running.exit_code) == ("failed", "exit_code", 4)
    assert (exited.state, exited.reason, exited.exit_code) == ("failed", "exit_code", 5)
    # Adoption streams logs from now on: "before" is not replayed, "after" arrives.
    assert recorder.lines(112) == ["before", "after"]
    assert len(recorder.outcomes[112]) == 1 and len(recorder.outcomes[113]) == 1
    wait_until(lambda: after_restart.list_jobs() == [])
    assert after_restart.adopt(114) is False


def test_adopted_job_keeps_its_deadline(docker_runtime: MakeRuntime, recorder: EventRecorder) -> None:
    before_restart = docker_runtime()
    before_restart.launch(spec(115, "sleep", "30", max_duration_s=2))
    recorder.wait_started(115)
    before_restart.close()

    after_restart = docker_runtime(timeout_grace_s=0)
    assert after_restart.adopt(115)
    outcome = recorder.wait_exit(115, timeout=15)

    assert (outcome.state, outcome.reason) == ("failed", "timeout")
