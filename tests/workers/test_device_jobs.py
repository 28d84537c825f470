"""The pieces of `bench/device_jobs.py` that decide pass/fail, against the fake driver (the run itself needs GPUs)."""

from __future__ import annotations

import pytest

from bench.device_jobs import GpuWatch, _job_pid, _uuid_matches
from tests.workers.fake_nvml import FakeGpu, FakeNvml

UUID = "GPU-44010bf2-eeee-a41a-3086-207405376fea"


def test_the_job_reported_uuid_must_be_the_one_the_portal_chose() -> None:
    # torch prints the uuid without NVML's "GPU-" prefix.
    logs = [
        "stdout: visible 'GPU-44010bf2' count 1",
        "stdout: device NVIDIA H200 uuid 44010bf2-eeee-a41a-3086-207405376fea pid 593",
    ]
    assert _uuid_matches(logs, UUID)
    assert not _uuid_matches(logs, "GPU-44010bf2-eeee-a41a-3086-000000000000")
    assert not _uuid_matches(["stdout: visible '' count 0"], UUID)
    assert _job_pid(logs) == 593
    assert _job_pid(["stdout: visible '' count 0"]) is None


def test_gpu_watch_reads_processes_on_every_tick_and_keeps_the_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUID, name="NVIDIA H200", utilization=0, processes=[], gpm_supported=True)
    fake = FakeNvml([gpu]).install(monkeypatch)
    watch = GpuWatch(every_s=0.01)
    try:
        watch.start()
        gpu.utilization, gpu.memory_used_mib, gpu.processes = 99, 1625, [(593, 1010)]
        deadline = 200
        while 593 not in watch.pids_on(UUID) and deadline:
            deadline -= 1
            watch._stop.wait(0.01)
        watch.stop()
        assert watch.pids_on(UUID) == {593}
        assert watch.max_util(UUID) == 99
        assert watch.max_mem(UUID) == 1625
        gpu.processes = []
        assert watch.snapshot(UUID)["procs"] == []
        assert fake.total("nvmlDeviceGetComputeRunningProcesses") == len(watch.ticks) + 1  # + the snapshot
    finally:
        watch.close()


def test_device_check_prints_mig_instances_and_their_memory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.device_check import check_nvml
    from tests.workers.fake_nvml import FakeMig

    gpu = FakeGpu(uuid=UUID, name="NVIDIA H200", memory_total_mib=143_771, mig_enabled=True)
    gpu.mig_slots = [FakeMig("MIG-aaaa", profile="1g.18gb", memory_total_mib=16_384, memory_used_mib=4_321, gi_id=9)]
    FakeNvml([gpu]).install(monkeypatch)
    report = check_nvml(2)
    out = capsys.readouterr().out
    assert "MIG MIG-aaaa  1g.18gb, 16384 MiB, GI 9" in out
    assert "MIG MIG-aaaa: 4321 MiB used" in out
    assert report["gpus"][0]["mig_devices"][0]["profile"] == "1g.18gb"
