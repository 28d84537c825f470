"""The agent's attribution of GPU memory to jobs (workers/jobmem.py): real processes and sessions from the process
runtime, a real container's cgroup from dockerd, the simulated backend's loads, and MIG instances; then the
`"j"` list on the wire."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.dockerd import IMAGE
from tests.workers.conftest import EventRecorder
from workers.gpu.base import GpuSample, row_to_sample, sample_to_row
from workers.gpu.simulated import SimulatedBackend
from workers.jobmem import JobMemory, RunningJob, container_of, session_of
from workers.runtimes.base import LaunchSpec
from workers.runtimes.process import ProcessRuntime
from workers.sampler import Sampler


def sample(uuid: str = "GPU-a", memory_used_mib: int = 1000, **fields: Any) -> GpuSample:
    return GpuSample(uuid, 0.0, 50, memory_used_mib, 81920, 40, 100.0, 1400, **fields)


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met")


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def test_a_process_belongs_to_the_job_whose_session_it_is_in(tmp_path: Path, recorder: EventRecorder) -> None:
    runtime = ProcessRuntime(state_dir=tmp_path, events=recorder.events)
    try:
        # The job forks: the GPU process NVML lists is the child, not the job's leader.
        script = f"{sys.executable} -c 'import time; time.sleep(60)' & wait"
        assert runtime.launch(LaunchSpec(job_id=31, image="", command=["sh", "-c", script]))
        handle = recorder.wait_started(31)
        leader = int(handle.removeprefix("pid:"))
        (child,) = wait_for(lambda: children(leader))
        assert session_of(child) == leader and session_of(os.getpid()) != leader
        jobs = [RunningJob(31, ("GPU-a",), handle), RunningJob(32, ("GPU-b",), "pid:1")]
        attributed = JobMemory(lambda: jobs).annotate(
            [sample(processes=[(child, 700), (os.getpid(), 50)]), sample("GPU-b", processes=[])]
        )
        # The test's own process holds GPU memory too, but belongs to no job: left out, not guessed. Job 32 has
        # nothing on GPU-b, whose listing is empty: it holds nothing there.
        assert [s.job_memory for s in attributed] == [{31: 700}, {32: 0}]
    finally:
        runtime.stop(31, grace_s=0.5)
        recorder.wait_exit(31)
        runtime.close()


def test_a_gone_process_and_an_unread_tick_attribute_nothing() -> None:
    assert session_of(2**22 + 12345) is None and container_of(2**22 + 12345) is None
    calls: list[int] = []

    def jobs() -> list[RunningJob]:
        calls.append(1)
        return [RunningJob(5, ("GPU-a",), "pid:999999")]

    quiet = [sample(), sample("GPU-b")]  # processes not read this tick (the slow read runs every ~10 s)
    assert JobMemory(jobs).annotate(quiet) == quiet and calls == []  # and the runner was not even asked
    (gone,) = JobMemory(jobs).annotate([sample(processes=[(2**22 + 12345, 10)])])
    assert gone.job_memory == {}


def test_container_ids_are_read_from_both_cgroup_layouts(tmp_path: Path) -> None:
    cid = "0123456789abcdef" * 4
    layouts = {
        101: f"0::/system.slice/docker-{cid}.scope\n",  # cgroup v2, systemd driver
        102: f"12:memory:/docker/{cid}\n11:pids:/docker/{cid}\n",  # cgroup v1, cgroupfs driver
        103: "0::/user.slice/user-1000.slice/session-2.scope\n",  # not in a container
    }
    for pid, text in layouts.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert [container_of(pid, tmp_path) for pid in layouts] == [cid, cid, None]
    jobs = [RunningJob(9, ("GPU-a",), cid)]
    (out,) = JobMemory(lambda: jobs, proc=tmp_path).annotate([sample(processes=[(101, 300), (102, 200), (103, 5)])])
    assert out.job_memory == {9: 500}  # every process of the container, summed


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_a_real_containers_process_is_found_by_its_cgroup(docker_runtime: Any, recorder: EventRecorder) -> None:
    runtime = docker_runtime()
    assert runtime.launch(LaunchSpec(job_id=41, image=IMAGE, command=["sleep", "60"]))
    container_id = recorder.wait_started(41)
    pid = runtime.client.containers.get(container_id).attrs["State"]["Pid"]
    assert container_of(pid) == container_id
    (out,) = JobMemory(lambda: [RunningJob(41, ("GPU-a",), container_id)]).annotate([sample(processes=[(pid, 1234)])])
    assert out.job_memory == {41: 1234}
    runtime.stop(41, grace_s=0.5)
    recorder.wait_exit(41)


def test_a_job_on_a_mig_instance_uses_what_the_instance_reports() -> None:
    jobs = [RunningJob(3, ("MIG-a-1",), "pid:999999"), RunningJob(4, ("MIG-a-2",), "pid:999998")]
    (out,) = JobMemory(lambda: jobs).annotate([sample(mig_memory={"MIG-a-1": 4_000, "MIG-a-3": 10})])
    # MIG-a-3 holds no job of this agent; job 4's instance was not read: neither is guessed.
    assert out.job_memory == {3: 4_000}


def test_simulated_jobs_sharing_a_gpu_are_told_apart() -> None:
    backend = SimulatedBackend("n1", ["A100-80GB", "A100-80GB:mig=1g.10gb*7"], seed=3)
    shared, mig = backend.discover()
    backend.assign(shared.uuid, "job-11", "const:60:0.2")
    backend.assign(shared.uuid, "job-12", "const:30:0.1")
    backend.assign(mig.mig_devices[0].uuid, "job-13", "const:50:0.5")
    sampler_jobs = [RunningJob(13, (mig.mig_devices[0].uuid,), "")]
    samples = JobMemory(lambda: sampler_jobs, job_of_pid=backend.job_of_pid).annotate(backend.sample(time.time()))
    on_shared, on_mig = (s.job_memory or {} for s in samples)
    assert set(on_shared) == {11, 12}
    assert on_shared[11] == pytest.approx(0.2 * 81920, rel=0.05)
    assert on_shared[12] == pytest.approx(0.1 * 81920, rel=0.05)
    assert set(on_mig) == {13} and on_mig[13] > 0
    backend.release(shared.uuid, "job-11")
    later = JobMemory(lambda: sampler_jobs, job_of_pid=backend.job_of_pid).annotate(backend.sample(time.time() + 11))
    assert set(later[0].job_memory or {}) == {12}


def test_job_memory_travels_in_the_row_and_back() -> None:
    out = sample(processes=[(10, 5)], job_memory={7: 5, 8: 0})
    row = sample_to_row(out)
    assert row[-1]["j"] == [[7, 5], [8, 0]]
    assert row_to_sample(row, 0.0).job_memory == {7: 5, 8: 0}
    assert "j" not in sample_to_row(sample(processes=[], job_memory={}))[-1]  # nothing attributed: nothing sent


def test_a_failing_attribution_does_not_cost_the_tick_its_readings() -> None:
    sent: list[dict[str, Any]] = []
    backend = SimulatedBackend("n1", ["A100-80GB"], seed=1)
    sampler = Sampler(backend, sent.append, node="n1")

    def broken(samples: list[GpuSample]) -> list[GpuSample]:
        raise OSError("proc is gone")

    sampler.annotate = broken
    sampler._tick(time.time())
    assert len(sent) == 1 and sent[0]["g"][0][0] == backend.discover()[0].uuid


def test_the_agents_sampler_sends_each_jobs_memory(tmp_path: Path) -> None:
    # The whole agent side at once: a job started by the runtime, followed by the simulated GPU, attributed.
    backend = SimulatedBackend("n1", ["A100-80GB"], seed=2, slow_every_s=0.0)
    (gpu,) = backend.discover()
    backend.assign(gpu.uuid, "job-21", "const:70:0.3")
    sent: list[dict[str, Any]] = []
    sampler = Sampler(backend, sent.append, node="n1")
    sampler.annotate = JobMemory(lambda: [RunningJob(21, (gpu.uuid,), "")], job_of_pid=backend.job_of_pid).annotate
    sampler._tick(time.time())
    (row,) = sent[0]["g"]
    ((job, mib, busy),) = row[-1]["j"]  # the job's memory and its processes' SM activity
    assert job == 21 and mib > 0 and busy > 30


def test_each_jobs_sm_activity_is_told_apart_on_a_shared_gpu() -> None:
    """Per-process utilization, attributed as memory is: each job's processes added up, capped at 100; a MIG
    instance's job takes its instance's GPM reading."""
    owner = {101: 7, 102: 7, 103: 8}
    out = JobMemory(lambda: [RunningJob(9, ("MIG-a-1",), "")], job_of_pid=owner.get).annotate(
        [
            sample(processes=[(101, 300), (102, 200), (103, 5), (104, 9)], process_util={101: 70, 102: 45, 103: 0}),
            sample(mig_memory={"MIG-a-1": 4_000}, mig_util={"MIG-a-1": 35}),
        ]
    )
    assert out[0].job_util == {7: 100, 8: 0} and out[0].job_memory == {7: 500, 8: 5}
    assert out[1].job_util == {9: 35}
    row = sample_to_row(out[0])
    assert row[-1]["j"] == [[7, 500, 100], [8, 5, 0]]
    assert row_to_sample(row, 0.0).job_util == {7: 100, 8: 0}
    # A node whose shares run under MPS: the processes' figures are not the jobs' (the MPS server's process may carry
    # its clients' work), so only the MIG instance's is kept.
    mps = JobMemory(lambda: [RunningJob(9, ("MIG-a-1",), "")], job_of_pid=owner.get, process_activity=False)
    (on_mps,) = mps.annotate([sample(processes=[(101, 300)], process_util={101: 70})])
    assert on_mps.job_util is None and on_mps.job_memory == {7: 300}
    (mig_there,) = mps.annotate([sample(mig_memory={"MIG-a-1": 4_000}, mig_util={"MIG-a-1": 35})])
    assert mig_there.job_util == {9: 35}
    # Processes read without utilization (not supported): memory only, as before.
    (plain,) = JobMemory(lambda: [], job_of_pid=owner.get).annotate([sample(processes=[(101, 300)])])
    assert plain.job_util is None and sample_to_row(plain)[-1]["j"] == [[7, 300]]


def test_simulated_shared_gpu_gives_each_job_its_own_utilization() -> None:
    backend = SimulatedBackend("n1", ["A100-80GB"], seed=5)
    (shared,) = backend.discover()
    backend.assign(shared.uuid, "job-21", "const:60:0.2")
    backend.assign(shared.uuid, "job-22", "const:0:0.1")  # holds memory, computes nothing
    (out,) = JobMemory(lambda: [], job_of_pid=backend.job_of_pid).annotate(backend.sample(time.time()))
    assert set(out.job_util or {}) == {21, 22}
    assert (out.job_util or {})[22] == 0 and (out.job_util or {})[21] > 30


def test_a_job_with_no_process_on_its_gpu_holds_nothing_there_when_the_listing_is_complete() -> None:
    """A job on a shared GPU that has not (or no longer) a CUDA context there reads 0 MiB and 0% beside a busy
    neighbour, so it is judged by its own minutes; never where the listing may hide it."""
    owner = {101: 7}
    jobs = [RunningJob(7, ("GPU-a",), ""), RunningJob(8, ("GPU-a",), ""), RunningJob(9, ("GPU-b",), "")]
    busy_neighbour = sample(processes=[(101, 900)], process_util={101: 80})  # 1,000 MiB used, 900 listed
    (out,) = JobMemory(lambda: jobs, job_of_pid=owner.get).annotate([busy_neighbour])
    assert out.job_memory == {7: 900, 8: 0} and out.job_util == {7: 80, 8: 0}
    assert sample_to_row(out)[-1]["j"] == [[7, 900, 80], [8, 0, 0]]
    assert out.others == (0, 0) and sample_to_row(out)[-1]["o"] == [0, 0]  # nothing on the GPU is no job's
    # Nothing on the GPU at all: both hold nothing; their SM activity was not read (NVML is not asked without
    # processes), so none is claimed.
    (empty,) = JobMemory(lambda: jobs, job_of_pid=owner.get).annotate([sample(processes=[], memory_used_mib=450)])
    assert empty.job_memory == {7: 0, 8: 0} and empty.job_util is None and empty.others == (0, 0)
    assert sample_to_row(empty)[-1]["j"] == [[7, 0], [8, 0]]
    # A process of nobody here (another tool, or a job whose pid the agent cannot map): job 8 may be that one.
    (foreign,) = JobMemory(lambda: jobs, job_of_pid=owner.get).annotate(
        [sample(processes=[(101, 500), (555, 400)], process_util={101: 80, 555: 0})]
    )
    assert foreign.job_memory == {7: 500} and foreign.job_util == {7: 80}
    # What that process uses is said apart: on a shared GPU, a reservation's holder's work.
    assert foreign.others == (400, 0)
    assert row_to_sample(sample_to_row(foreign), 0.0).others == (400, 0)
    # Memory used that the listing does not explain (an agent without the host's PID namespace sees no process).
    (hidden,) = JobMemory(lambda: jobs, job_of_pid=owner.get).annotate([sample(processes=[], memory_used_mib=30_000)])
    assert hidden.job_memory == {} and hidden.job_util is None and hidden.others is None
    assert "o" not in sample_to_row(hidden)[-1]
    # Under MPS the processes' figures are not read as the jobs': memory only.
    (mps,) = JobMemory(lambda: jobs, job_of_pid=owner.get, process_activity=False).annotate([busy_neighbour])
    assert mps.job_memory == {7: 900, 8: 0} and mps.job_util is None and mps.others == (0, None)
    assert sample_to_row(mps)[-1]["o"] == [0]
    # A GPU in MIG mode: its jobs are on instances, judged by what the instances report.
    mig_jobs = [RunningJob(10, ("MIG-a-1",), ""), RunningJob(11, ("MIG-a-2",), "")]
    (mig,) = JobMemory(lambda: mig_jobs).annotate([sample(processes=[], mig_memory={"MIG-a-1": 4_000})])
    assert mig.job_memory == {10: 4_000} and mig.others is None
    # Not read this tick: nothing said.
    assert JobMemory(lambda: jobs, job_of_pid=owner.get).annotate([sample()])[0].job_memory is None


def test_a_simulated_job_that_leaves_its_share_reads_zero() -> None:
    backend = SimulatedBackend("n1", ["A100-80GB"], seed=5)
    (shared,) = backend.discover()
    backend.assign(shared.uuid, "job-31", "const:60:0.2")
    jobs = [RunningJob(31, (shared.uuid,), ""), RunningJob(32, (shared.uuid,), "")]  # 32 runs, nothing on the GPU
    (out,) = JobMemory(lambda: jobs, job_of_pid=backend.job_of_pid).annotate(backend.sample(time.time()))
    assert (out.job_memory or {})[32] == 0 and (out.job_util or {})[32] == 0
    assert (out.job_memory or {})[31] > 0 and (out.job_util or {})[31] > 30
