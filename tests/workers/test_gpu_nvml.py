"""NvmlBackend against the fake driver in fake_nvml.py (real pynvml module, constants, errors and ctypes types)."""

from __future__ import annotations

import json
import logging

import pynvml
import pytest

from tests.workers.fake_nvml import FakeGpu, FakeMig, FakeNvml
from workers.gpu import open_backend
from workers.gpu.base import HEALTH_OK, GpuBackend, build_message, parse_message
from workers.gpu.nvml import NvmlBackend, NvmlUnavailable
from workers.gpu.simulated import SimulatedBackend

PER_TICK = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetFieldValues",
)
SLOW = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows",
)


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-11111111-2222-3333-4444-555555555555",
            name="NVIDIA H100 80GB HBM3",
            memory_total_mib=81_559,
            memory_used_mib=40_000,
            utilization=87,
            temperature=64,
            power_mw=312_437,
            sm_clock=1_980,
            gpm_supported=True,
            tensor_pct=41.25,
            processes=[(4242, 39_000), (17, 512)],
        ),
        FakeGpu(
            uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            name="NVIDIA A100-SXM4-40GB",
            memory_total_mib=40_960,
            memory_used_mib=3,
            utilization=0,
            temperature=31,
            power_mw=52_500,
            sm_clock=210,
        ),
    ]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml(two_gpus()).install(monkeypatch)


def test_discover_enumerates_gpus_with_model_keys(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    infos = backend.discover()
    assert isinstance(backend, GpuBackend)
    assert [(i.index, i.uuid, i.name, i.model, i.memory_mib, i.mig_mode) for i in infos] == [
        (0, "GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H100 80GB HBM3", "H100-80GB", 81_559, False),
        (1, "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "NVIDIA A100-SXM4-40GB", "A100-40GB", 40_960, False),
    ]
    assert infos[0].extra == {"driver_version": "570.124.06", "tensor_active_source": "gpm"}
    assert infos[1].extra["tensor_active_source"] is None
    # Discovery is done once; a second call must not re-enumerate through the driver.
    assert backend.discover() == infos
    assert fake.count("nvmlDeviceGetCount") == 1
    backend.close()


def test_mig_mode_is_reported_and_disables_gpm(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig_enabled = True
    fake = FakeNvml(gpus).install(monkeypatch)
    backend = NvmlBackend()
    infos = backend.discover()
    assert [i.mig_mode for i in infos] == [True, False]
    assert infos[0].extra["tensor_active_source"] is None
    assert backend.sample(1000.0)[0].tensor_active is None
    assert fake.total("nvmlGpmSampleGet") == 0
    backend.close()


def test_mig_instances_are_discovered_and_their_memory_read_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig_enabled = True
    gpus[0].mig_slots = [
        FakeMig("MIG-aaaa", profile="3g.40gb", memory_total_mib=40_192, memory_used_mib=31_000, gi_id=1),
        None,  # an empty slot: skipped
        FakeMig("MIG-bbbb", memory_used_mib=13, gi_id=9),
    ]
    fake = FakeNvml(gpus).install(monkeypatch)
    backend = NvmlBackend()
    info = backend.discover()[0]
    assert [(d.uuid, d.profile, d.memory_mib, d.gi_id) for d in info.mig_devices] == [
        ("MIG-aaaa", "3g.40gb", 40_192, 1),
        ("MIG-bbbb", "1g.10gb", 9_728, 9),
    ]
    first, whole = backend.sample(1000.0)
    assert first.mig_memory == {"MIG-aaaa": 31_000, "MIG-bbbb": 13}
    assert whole.mig_memory is None  # not in MIG mode: nothing to read
    # Read again on the next tick, through the handles kept from discovery (no new walk of the slots).
    walks = fake.total("nvmlDeviceGetMigDeviceHandleByIndex")
    gpus[0].mig_slots[2].memory_used_mib = 9_000  # type: ignore[union-attr]
    second = backend.sample(1001.0)[0]
    assert second.mig_memory == {"MIG-aaaa": 31_000, "MIG-bbbb": 9_000}
    assert fake.total("nvmlDeviceGetMigDeviceHandleByIndex") == walks
    # One instance that cannot be read is left out (unknown is not zero) and named in the error; the rest stay.
    gpus[0].mig_slots[0].error = pynvml.NVML_ERROR_UNKNOWN  # type: ignore[union-attr]
    third = backend.sample(1002.0)[0]
    assert third.mig_memory == {"MIG-bbbb": 9_000}
    assert third.error is not None and "MIG-aaaa" in third.error
    # It travels in the telemetry message and comes back the same.
    (_, _, _, decoded) = parse_message(json.loads(json.dumps(build_message("n", [second], ts=1001.0, seq=1))))
    assert decoded[0].mig_memory == second.mig_memory
    # A GPU that is lost while its instances are read is lost, as for any read.
    gpus[0].mig_slots[2].error = pynvml.NVML_ERROR_GPU_IS_LOST  # type: ignore[union-attr]
    gpus[0].mig_slots[0].error = None  # type: ignore[union-attr]
    lost = backend.sample(1003.0)[0]
    assert lost.health["lost"] is True and lost.mig_memory is None
    backend.close()


def test_mig_instances_sm_activity_comes_from_gpm_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 in MIG mode: NVML has no utilization for it, GPM gives each instance's SM activity through
    nvmlGpmMigSampleGet (the GPU's handle, the instance's GPU instance id); an A100 (no GPM) is not asked."""
    gpus = two_gpus()
    gpus[0].mig_enabled = True
    gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpus[0].mig_slots = [FakeMig("MIG-aaaa", gi_id=1, sm_pct=62.4), FakeMig("MIG-bbbb", gi_id=9, sm_pct=0.0)]
    gpus[1].mig_enabled = True
    gpus[1].mig_slots = [FakeMig("MIG-cccc", gi_id=2, sm_pct=90.0)]
    fake = FakeNvml(gpus).install(monkeypatch)
    backend = NvmlBackend()
    backend.discover()
    first = backend.sample(1000.0)
    assert first[0].mig_util is None and first[0].utilization_pct is None  # a rate needs two samples
    second, a100 = backend.sample(1001.0)
    assert second.mig_util == {"MIG-aaaa": 62, "MIG-bbbb": 0} and second.tensor_active is None
    assert a100.mig_util is None and a100.mig_memory == {"MIG-cccc": 13}
    assert fake.count("nvmlGpmMigSampleGet", 0) == 4 and fake.count("nvmlGpmMigSampleGet", 1) == 0
    assert fake.total("nvmlGpmSampleGet") == 0  # no tensor activity for a GPU in MIG mode
    # On the wire: a third element per instance, decoded back the same; an old two-element entry still reads.
    (_, _, _, decoded) = parse_message(json.loads(json.dumps(build_message("n", [second, a100], ts=1001.0, seq=1))))
    assert decoded[0].mig_util == second.mig_util and decoded[0].mig_memory == second.mig_memory
    assert decoded[1].mig_util is None
    # One instance that cannot be read is left out and named; the other keeps its figure.
    gpus[0].mig_slots[1].error = pynvml.NVML_ERROR_UNKNOWN  # type: ignore[union-attr]
    gpus[0].mig_slots[0].sm_pct = 5.0  # type: ignore[union-attr]
    third = backend.sample(1002.0)[0]
    assert third.mig_util == {"MIG-aaaa": 5} and third.error is not None and "MIG-bbbb" in third.error
    # The layout changes (mig-parted): the gone instance's buffers are freed, the new one gets its own.
    live = fake.live_gpm_buffers
    gpus[0].mig_slots = [FakeMig("MIG-aaaa", gi_id=1, sm_pct=5.0), FakeMig("MIG-dddd", gi_id=3, sm_pct=40.0)]
    assert backend.refresh_layout() is True
    assert fake.live_gpm_buffers == live - 2
    backend.sample(1003.0)
    assert backend.sample(1004.0)[0].mig_util == {"MIG-aaaa": 5, "MIG-dddd": 40}
    backend.close()
    assert fake.live_gpm_buffers == 0


def test_a_gpu_without_gpm_for_instances_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()[:1]
    gpus[0].mig_enabled = True
    gpus[0].mig_slots = [FakeMig("MIG-aaaa", gi_id=1, sm_pct=50.0)]
    fake = FakeNvml(gpus).install(monkeypatch)
    backend = NvmlBackend()
    backend.discover()
    gpus[0].gpm_supported = False  # GPM answers NOT_SUPPORTED for instances on this driver
    assert backend.sample(1000.0)[0].mig_util is None
    backend.sample(1001.0)
    assert fake.count("nvmlGpmMigSampleGet", 0) == 1 and backend.sample(1002.0)[0].mig_memory == {"MIG-aaaa": 13}
    backend.close()


def test_sample_values_are_converted_to_portal_units(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    first, second = backend.sample(1000.0)
    assert first.ts == 1000.0
    assert first.utilization_pct == 87
    assert first.memory_used_mib == 40_000
    assert first.memory_total_mib == 81_559
    assert first.temperature_c == 64
    assert first.power_w == pytest.approx(312.4)
    assert first.sm_clock_mhz == 1_980
    assert first.processes == [(17, 512), (4242, 39_000)]
    assert first.health == {**HEALTH_OK, "ecc_dbe": 0, "xid": 0, "last_xid": None, "lost": False}
    assert first.error is None
    # GPM needs two samples: no tensor figure on the first tick, then the driver's value as a fraction.
    assert first.tensor_active is None
    assert backend.sample(1001.0)[0].tensor_active == 0.412  # 41.25 % rounded to 3 decimals
    assert second.utilization_pct == 0
    assert second.power_w == pytest.approx(52.5)
    assert second.tensor_active is None
    assert second.processes == []
    backend.close()


def test_each_metric_is_read_once_per_gpu_per_sample_and_processes_at_the_slow_rate(fake: FakeNvml) -> None:
    backend = NvmlBackend(slow_every_s=10.0)
    backend.discover()
    discovery_memory_calls = fake.count("nvmlDeviceGetMemoryInfo", 0)
    samples = [backend.sample(1000.0 + t) for t in range(25)]  # ticks at t=0..24: slow ticks at 0, 10, 20
    for index in (0, 1):
        for function in PER_TICK:
            assert fake.count(function, index) == 25, function
        assert fake.count("nvmlDeviceGetMemoryInfo", index) - (discovery_memory_calls if index == 0 else 1) == 25
        for function in SLOW:
            assert fake.count(function, index) == 3, function
        assert fake.count("nvmlDeviceGetClockInfo", index) == 25 + 3  # SM clock every tick, memory clock slow
        assert fake.count("nvmlDeviceGetPcieThroughput", index) == 2 * 3  # TX and RX, 20 ms each: slow
    assert fake.count("nvmlGpmSampleGet", 0) == 25
    assert fake.count("nvmlGpmSampleGet", 1) == 0  # no GPM on the A100: never asked per tick
    assert fake.count("nvmlGpmMetricsGet") == 24
    assert fake.count("nvmlEventSetWait") == 25  # one per node per tick when no event is pending
    with_procs = [t for t, s in enumerate(samples) if s[0].processes is not None]
    assert with_procs == [0, 10, 20]
    assert all((s[0].processes is None) == (s[1].processes is None) for s in samples)
    backend.close()


def test_lost_gpu_is_marked_and_no_longer_called_while_others_continue(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    backend = NvmlBackend()
    backend.sample(1000.0)
    fake.gpus[1].lost = True
    with caplog.at_level(logging.ERROR, logger="workers.gpu.nvml"):
        healthy, lost = backend.sample(1001.0)
    assert healthy.utilization_pct == 87 and healthy.error is None
    assert lost.health["lost"] is True
    assert lost.error is not None and "lost" in lost.error.lower()
    assert lost.utilization_pct is None and lost.power_w is None and lost.memory_used_mib is None
    assert "is lost" in caplog.text
    # The first failing call ends this GPU's reads for the tick, and later ticks do not call it at all.
    calls_after_loss = sum(fake.count(f, 1) for f in PER_TICK)
    later = backend.sample(1002.0)
    assert sum(fake.count(f, 1) for f in PER_TICK) == calls_after_loss
    assert later[1].health["lost"] is True and later[0].utilization_pct == 87
    row = build_message("n1", later, ts=1002.0, seq=3)["g"][1]
    assert row[8]["h"] == {"lost": True}
    backend.close()


def test_not_supported_metric_becomes_none_and_is_not_asked_again(fake: FakeNvml) -> None:
    fake.gpus[1].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.gpus[1].errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(slow_every_s=1.0)
    for t in range(5):
        samples = backend.sample(1000.0 + t)
        assert samples[1].power_w is None
        assert samples[1].error is None  # "not supported" is a property of the board, not an error
        assert samples[1].health["ecc_dbe"] is None
        assert samples[1].utilization_pct == 0
        assert samples[0].power_w == pytest.approx(312.4)
    assert fake.count("nvmlDeviceGetPowerUsage", 1) == 1
    assert fake.count("nvmlDeviceGetTotalEccErrors", 1) == 1
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == 5
    backend.close()


def test_transient_error_sets_error_for_that_tick_only(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    fake.gpus[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    bad = backend.sample(1000.0)[0]
    assert bad.temperature_c is None
    assert bad.error == "temperature: Unknown Error"
    assert bad.utilization_pct == 87
    del fake.gpus[0].errors["nvmlDeviceGetTemperature"]
    good = backend.sample(1001.0)[0]
    assert good.temperature_c == 64 and good.error is None
    backend.close()


def test_xid_events_and_ecc_count_reach_health(fake: FakeNvml) -> None:
    backend = NvmlBackend(slow_every_s=10.0)
    backend.sample(1000.0)
    fake.raise_xid(1, 48)
    fake.raise_xid(1, 79)
    fake.gpus[0].ecc_dbe = 2
    samples = backend.sample(1001.0)
    assert samples[1].health == {**HEALTH_OK, "ecc_dbe": 0, "xid": 2, "last_xid": 79, "lost": False}
    assert samples[0].health["xid"] == 0
    assert samples[0].health["ecc_dbe"] == 0  # ECC is read on the slow tick only
    assert backend.sample(1010.0)[0].health["ecc_dbe"] == 2
    backend.close()


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 was not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_init_failure_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch, code: int, hint: str) -> None:
    FakeNvml(two_gpus(), init_error=code).install(monkeypatch)
    with pytest.raises(NvmlUnavailable, match="NVML initialization failed") as err:
        NvmlBackend()
    assert hint in str(err.value)
    assert isinstance(err.value.__cause__, pynvml.NVMLError)


def test_real_library_absent_gives_clear_error() -> None:
    # This machine has no NVIDIA driver: the real bindings fail to load libnvidia-ml.so.1.
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("a real NVML is present")
    with pytest.raises(NvmlUnavailable, match=r"NVML initialization failed: .*libnvidia-ml"):
        NvmlBackend()


def test_close_frees_resources_and_shuts_down_once(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    backend.sample(1000.0)
    assert fake.refcount == 1 and fake.live_gpm_buffers == 2
    backend.close()
    backend.close()
    assert fake.refcount == 0
    assert fake.live_gpm_buffers == 0
    assert fake.count("nvmlEventSetFree") == 1
    with pytest.raises(RuntimeError, match="closed"):
        backend.sample(1001.0)


def test_message_is_small_and_round_trips(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    samples = backend.sample(1000.0)
    samples = backend.sample(1001.0)
    message = build_message("gpu-node-01", samples, ts=1001.0, seq=2)
    text = json.dumps(message, separators=(",", ":"))
    assert len(text) < 480  # two rows of ~80 bytes plus ~50 of device counters each
    node, ts, seq, decoded = parse_message(json.loads(text))
    assert (node, ts, seq) == ("gpu-node-01", 1001.0, 2)
    assert decoded == samples
    backend.close()


def test_open_backend_prefers_nvml_and_falls_back_to_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(two_gpus()).install(monkeypatch)
    backend = open_backend("auto", node_name="n1")
    assert isinstance(backend, NvmlBackend) and len(backend.discover()) == 2
    backend.close()
    fake.gpus.clear()  # a driver without GPUs: simulate instead, and do not leak the NVML session
    fallback = open_backend("auto", node_name="n1", simulated_models=["L40S-48GB"])
    assert isinstance(fallback, SimulatedBackend) and fallback.discover()[0].model == "L40S-48GB"
    assert fake.refcount == 0
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert isinstance(open_backend("auto", node_name="n1"), SimulatedBackend)
    with pytest.raises(NvmlUnavailable, match="driver is not loaded"):
        open_backend("nvml", node_name="n1")
    with pytest.raises(ValueError, match="unknown GPU backend"):
        open_backend("dcgm", node_name="n1")


def test_failed_ecc_read_keeps_the_last_known_count(fake: FakeNvml) -> None:
    backend = NvmlBackend(slow_every_s=1.0)
    fake.gpus[0].ecc_dbe = 3
    assert backend.sample(1000.0)[0].health["ecc_dbe"] == 3
    fake.gpus[0].errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_UNKNOWN
    failed = backend.sample(1001.0)[0]
    assert failed.health["ecc_dbe"] == 3 and failed.error == "ecc_dbe: Unknown Error"
    backend.close()


def test_device_counters_travel_with_every_sample_and_missing_ones_are_left_out(fake: FakeNvml) -> None:
    fake.gpus[1].memory_temp = None  # no HBM sensor
    fake.gpus[1].nvlink_kib = None  # a PCIe board
    fake.gpus[0].remapped_rows = (3, 1, 0, 1)
    backend = NvmlBackend(slow_every_s=10.0)
    first = backend.sample(1000.0)
    assert first[0].counters == {
        "en": 1_234_567,
        "mt": 41,
        "nvl": 3_000,
        "mc": 1_593,
        "ptx": 2_048,
        "prx": 4_096,
        "prc": 0,
    }
    assert first[1].counters == {"en": 1_234_567, "mc": 1_593, "ptx": 2_048, "prx": 4_096, "prc": 0}
    assert first[0].health["remap_cor"] == 3 and first[0].health["remap_unc"] == 1
    assert first[0].health["remap_fail"] is True and first[1].health["remap_fail"] is False
    fake.gpus[0].energy_mj = 2_000_000
    fake.gpus[0].pcie_kbps = (1, 1)
    second = backend.sample(1001.0)  # not a slow tick: energy is new, the PCIe figures are the slow tick's
    assert second[0].counters["en"] == 2_000_000 and second[0].counters["ptx"] == 2_048
    assert first[0].error is None and first[1].error is None
    # Through the wire format and back, unchanged; the remap health only where it signals a problem.
    message = json.loads(json.dumps(build_message("n1", second, ts=1001.0, seq=1)))
    _node, _ts, _seq, decoded = parse_message(message)
    assert [s.counters for s in decoded] == [s.counters for s in second]
    assert message["g"][0][8]["h"] == {"remap_cor": 3, "remap_unc": 1, "remap_fail": True}
    assert "h" not in message["g"][1][8]
    assert message["g"][1][8]["x"] == [None, 1_593, 1_234_567, 2_048, 4_096, 0]  # positional: no HBM sensor, no NVLink
    backend.close()


def test_a_layout_changed_under_the_agent_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """mig-parted made the instances anew (new uuids, another layout) while the agent ran: `refresh_layout` reads
    them, and the per-instance memory is read through the new handles; a failed read keeps the layout."""
    gpus = two_gpus()
    gpus[0].mig_enabled = True
    gpus[0].mig_slots = [FakeMig("MIG-aaaa", gi_id=7), FakeMig("MIG-bbbb", gi_id=8)]
    FakeNvml(gpus).install(monkeypatch)
    backend = NvmlBackend()
    assert [d.uuid for d in backend.discover()[0].mig_devices] == ["MIG-aaaa", "MIG-bbbb"]
    assert backend.refresh_layout() is False  # nothing changed
    gpus[0].mig_slots = [
        FakeMig("MIG-cccc", profile="3g.40gb", memory_total_mib=40_192, memory_used_mib=500, gi_id=1),
        None,
    ]
    assert backend.refresh_layout() is True
    info = backend.discover()[0]
    assert info.mig_mode and [(d.uuid, d.profile) for d in info.mig_devices] == [("MIG-cccc", "3g.40gb")]
    assert backend.sample(1000.0)[0].mig_memory == {"MIG-cccc": 500}
    assert backend.refresh_layout() is False
    # A read that fails is not a new layout.
    gpus[0].errors["nvmlDeviceGetMigMode"] = pynvml.NVML_ERROR_UNKNOWN
    assert backend.refresh_layout() is False
    assert [d.uuid for d in backend.discover()[0].mig_devices] == ["MIG-cccc"]
    # MIG mode off: a whole GPU again, nothing per instance to read.
    del gpus[0].errors["nvmlDeviceGetMigMode"]
    gpus[0].mig_enabled = False
    assert backend.refresh_layout() is True
    assert not backend.discover()[0].mig_mode and backend.discover()[0].mig_devices == ()
    assert backend.sample(1001.0)[0].mig_memory is None
    backend.close()


def test_process_utilization_is_each_listed_process_mean_since_the_last_read(fake: FakeNvml) -> None:
    """nvmlDeviceGetProcessUtilization(handle, last seen): a process's mean over its new samples, 0 for a listed
    process without any, NOT_FOUND (no samples) as all zeros, a sample already counted never counted again."""
    gpu = fake.gpus[0]
    gpu.process_samples = [(4242, 1_000, 90), (4242, 2_000, 70), (17, 2_000, 4), (999, 2_000, 50)]
    backend = NvmlBackend(slow_every_s=10.0)
    first = backend.sample(1000.0)[0]
    assert first.process_util == {4242: 80, 17: 4}  # pid 999 is not among the processes listed
    assert backend.sample(1001.0)[0].process_util is None  # not a slow tick: not read
    gpu.process_samples.append((4242, 3_000, 30))
    assert backend.sample(1010.0)[0].process_util == {4242: 30, 17: 0}  # only the sample newer than 2,000 µs
    assert backend.sample(1020.0)[0].process_util == {4242: 0, 17: 0}  # NOT_FOUND: nothing ran since
    assert fake.count("nvmlDeviceGetProcessUtilization", 0) == 3
    assert fake.count("nvmlDeviceGetProcessUtilization", 1) == 0  # no process on the A100: nothing to ask
    # It travels as the third element of the "p" entries and reads back equal.
    (back,) = parse_message(build_message("n", [first], ts=1000.0, seq=1))[3]
    assert back.process_util == first.process_util and back.processes == first.processes
    backend.close()


def test_process_utilization_not_supported_is_not_asked_again(fake: FakeNvml) -> None:
    fake.gpus[0].errors["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(slow_every_s=10.0)
    assert backend.sample(1000.0)[0].process_util is None
    assert backend.sample(1010.0)[0].processes == [(17, 512), (4242, 39_000)]
    assert fake.count("nvmlDeviceGetProcessUtilization", 0) == 1
    backend.close()
