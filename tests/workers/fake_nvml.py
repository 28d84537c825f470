"""A test double for NVML that replaces the real `pynvml` module's functions, one by one, with faithful fakes.

What stays real: the `pynvml` module itself, its constants, `NVMLError` (so `NVMLError(code)` becomes the same
subclass, e.g. `NVMLError_GpuIsLost`, that the real bindings raise) and its ctypes types: handles are real
`c_nvmlDevice_t` pointers, memory is a `c_nvmlMemory_t`, utilization a `c_nvmlUtilization_t`, events a
`c_nvmlEventData_t`, GPM samples real `c_nvmlGpmSample_t` pointers filled into a real `c_nvmlGpmMetricsGet_t`.
What is fake: the driver behind them. Every call is counted per (function, GPU index).

Behaviours copied from the library: calls before `nvmlInit` (or after the last `nvmlShutdown`) raise
UNINITIALIZED; bad enum arguments raise INVALID_ARGUMENT; `nvmlEventSetWait` raises TIMEOUT when no event is
pending; processes are `nvmlFriendlyObject`s with `usedGpuMemory` in bytes; power is in milliwatts.
"""

from __future__ import annotations

import ctypes
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

MIB = 1024 * 1024

# The functions NvmlBackend uses; install() replaces exactly these.
PATCHED = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmSampleFree",
)


@dataclass
class FakeGpu:
    """What the fake driver knows about one board. Tests change the fields between samples."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_mib: int = 81_920
    memory_used_mib: int = 0
    utilization: int = 0
    memory_utilization: int = 0
    temperature: int = 30
    power_mw: int = 60_000
    sm_clock: int = 210
    mig_enabled: bool = False
    gpm_supported: bool = False
    tensor_pct: float = 0.0  # what the GPM tensor metric reports, 0..100
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used MiB)
    # The driver's per-process utilization samples: (pid, CPU timestamp in µs, SM %), oldest first.
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)
    ecc_dbe: int = 0
    lost: bool = False
    energy_mj: int = 1_234_567
    memory_temp: int | None = 41  # None: no HBM sensor (the field answers NOT_SUPPORTED)
    nvlink_kib: tuple[int, int] | None = (1_000, 2_000)  # (TX, RX) KiB since boot; None: no NVLink
    pcie_kbps: tuple[int, int] = (2_048, 4_096)  # (TX, RX) KB/s as nvmlDeviceGetPcieThroughput reports
    pcie_replays: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure
    # NVML function name -> error code it raises for this GPU (e.g. NOT_SUPPORTED for power on some boards)
    errors: dict[str, int] = field(default_factory=dict)
    # MIG mode: the device slots, each an instance or None (empty slot: NOT_FOUND, as the driver answers)
    mig_slots: list[FakeMig | None] = field(default_factory=list)
    # The GPU-instance profiles the board offers: NVML profile id -> (name, slices, how many fit, memory MB); empty
    # for a board without MIG (NOT_SUPPORTED for every id).
    gi_profiles: dict[int, tuple[str, int, int, int]] = field(default_factory=dict)


@dataclass
class FakeMig:
    """One MIG instance of a FakeGpu; `error`, when set, is what reading its memory raises."""

    uuid: str
    profile: str = "1g.10gb"
    memory_total_mib: int = 9_728
    memory_used_mib: int = 13
    gi_id: int = 7
    error: int | None = None
    sm_pct: float = 0.0  # what GPM's SM activity reports for this instance, 0..100


class FakeNvml:
    """The fake driver: a list of FakeGpu plus the library's global state (init refcount, event sets)."""

    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "570.124.06", init_error: int | None = None):
        self.gpus = gpus
        self.driver_version = driver_version
        self.init_error = init_error
        self.refcount = 0
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]  # keep alive: handles point into them
        self._handles = [pynvml.c_nvmlDevice_t(s) for s in self._structs]
        self._event_sets: dict[int, tuple[Any, int, set[int]]] = {}  # address -> (struct, mask, gpu indices)
        self._pending_events: deque[tuple[int, int]] = deque()  # (gpu index, xid)
        # address -> (struct, source, {metric id: value}); source: the GPU index, or (index, GPU instance id)
        self._gpm_buffers: dict[int, tuple[Any, Any, dict[int, float]]] = {}
        # MIG device handles are real c_nvmlDevice_t pointers too, one struct per (GPU, slot), kept alive here.
        self._mig_structs: dict[tuple[int, int], Any] = {}

    # -- test helpers ----------------------------------------------------------------------------------------

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        for name in PATCHED:
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    def raise_xid(self, index: int, xid: int) -> None:
        """Queue a critical Xid event for GPU `index`, as the driver would after a fault."""
        self._pending_events.append((index, xid))

    def count(self, function: str, index: int | None = None) -> int:
        """Calls of `function` for GPU `index` (None: the calls not tied to one GPU)."""
        return self.calls[(function, index)]

    def total(self, function: str) -> int:
        return sum(n for (fn, _), n in self.calls.items() if fn == function)

    @property
    def live_gpm_buffers(self) -> int:
        return len(self._gpm_buffers)

    # -- internals -------------------------------------------------------------------------------------------

    def _enter(self, function: str, index: int | None = None) -> FakeGpu | None:
        self.calls[(function, index)] += 1
        if self.refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if index is None:
            return None
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[function])
        return gpu

    def _index(self, handle: Any) -> int:
        if not isinstance(handle, pynvml.c_nvmlDevice_t) or not handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        address = ctypes.addressof(handle.contents)
        for i, s in enumerate(self._structs):
            if ctypes.addressof(s) == address:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _gpu(self, function: str, handle: Any) -> FakeGpu:
        gpu = self._enter(function, self._index(handle))
        assert gpu is not None
        return gpu

    def _mig(self, function: str, handle: Any) -> FakeMig | None:
        """The instance behind a MIG device handle (its parent's loss and errors apply), None for a GPU handle."""
        if not isinstance(handle, pynvml.c_nvmlDevice_t) or not handle:
            return None
        address = ctypes.addressof(handle.contents)
        for (index, slot), struct in self._mig_structs.items():
            if ctypes.addressof(struct) == address:
                self._enter(function, index)
                mig = self.gpus[index].mig_slots[slot]
                assert mig is not None
                return mig
        return None

    # -- library lifecycle -----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    # -- enumeration -----------------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        mig = self._mig("nvmlDeviceGetUUID", handle)
        return mig.uuid if mig else self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        mig = self._mig("nvmlDeviceGetName", handle)
        if mig is not None:
            return f"NVIDIA A100-SXM4-80GB MIG {mig.profile}"
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", device)
        return len(gpu.mig_slots) if gpu.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        parent = self._index(device)
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not gpu.mig_enabled or not 0 <= index < len(gpu.mig_slots):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig_slots[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        struct = self._mig_structs.setdefault((parent, index), pynvml.struct_c_nvmlDevice_t())
        return pynvml.c_nvmlDevice_t(struct)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        mig = self._mig("nvmlDeviceGetGpuInstanceId", device)
        if mig is None:  # a GPU handle: the driver answers INVALID_ARGUMENT
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gi_id

    # -- metrics ---------------------------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        mig = self._mig("nvmlDeviceGetMemoryInfo", handle)
        if mig is not None:
            if mig.error is not None:
                raise pynvml.NVMLError(mig.error)
            total, used = mig.memory_total_mib * MIB, mig.memory_used_mib * MIB
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        total, used = gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.memory_utilization)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type not in (
            pynvml.NVML_CLOCK_GRAPHICS,
            pynvml.NVML_CLOCK_SM,
            pynvml.NVML_CLOCK_MEM,
            pynvml.NVML_CLOCK_VIDEO,
        ):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.sm_clock if type == pynvml.NVML_CLOCK_SM else 1_593

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": mib * MIB, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid, mib in gpu.processes
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """The samples newer than `timeStamp`, as the library returns them (its ctypes structs); NOT_FOUND when
        there are none, NOT_SUPPORTED in MIG mode, as the driver answers."""
        gpu = self._gpu("nvmlDeviceGetProcessUtilization", handle)
        if gpu.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        newer = [(pid, ts, sm) for pid, ts, sm in gpu.process_samples if ts > timeStamp]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, ts, sm in newer:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil = pid, ts, sm
            out.append(sample)
        return out

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if not gpu.gi_profiles:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if profile not in gpu.gi_profiles:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        name, slices, count, memory = gpu.gi_profiles[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = profile, slices, count, memory
        info.name = f"MIG {name}".encode()
        return info

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counterType != pynvml.NVML_VOLATILE_ECC:
            return 0
        return gpu.ecc_dbe

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        known: dict[int, int | None] = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: gpu.memory_temp,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: None if gpu.nvlink_kib is None else gpu.nvlink_kib[0],
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: None if gpu.nvlink_kib is None else gpu.nvlink_kib[1],
        }
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            value = known.get(field_id)
            if value is None:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:  # the driver answers temperatures as unsigned int
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = value
            else:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = value
        return values

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.pcie_kbps[0 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1]

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", handle).remapped_rows

    # -- events ----------------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        struct = pynvml.struct_c_nvmlEventSet_t()
        self._event_sets[ctypes.addressof(struct)] = (struct, 0, set())
        return pynvml.c_nvmlEventSet_t(struct)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        index = self._index(handle)
        self._enter("nvmlDeviceRegisterEvents", index)
        struct, mask, indices = self._event_sets[ctypes.addressof(eventSet.contents)]
        indices.add(index)
        self._event_sets[ctypes.addressof(struct)] = (struct, mask | eventTypes, indices)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait")
        _struct, mask, indices = self._event_sets[ctypes.addressof(eventSet.contents)]
        while self._pending_events:
            index, xid = self._pending_events.popleft()
            if index in indices and mask & pynvml.nvmlEventTypeXidCriticalError:
                data = pynvml.c_nvmlEventData_t()
                data.device = self._handles[index]
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = xid
                return data
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        del self._event_sets[ctypes.addressof(eventSet.contents)]

    # -- GPM -------------------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm_supported else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        struct = pynvml.struct_c_nvmlGpmSample_t()
        self._gpm_buffers[ctypes.addressof(struct)] = (struct, None, {})
        return pynvml.c_nvmlGpmSample_t(struct)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        index = self._index(device)
        gpu = self._enter("nvmlGpmSampleGet", index)
        assert gpu is not None
        if not gpu.gpm_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        address = ctypes.addressof(gpmSample.contents)
        struct, _, _ = self._gpm_buffers[address]
        self._gpm_buffers[address] = (struct, index, {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: gpu.tensor_pct})
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        index = self._index(device)  # the GPU's handle, as NVML wants it (an instance's handle is refused)
        gpu = self._enter("nvmlGpmMigSampleGet", index)
        assert gpu is not None
        if not gpu.gpm_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in gpu.mig_slots if m is not None and m.gi_id == gpuInstanceId), None)
        if not gpu.mig_enabled or mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if mig.error is not None:
            raise pynvml.NVMLError(mig.error)
        address = ctypes.addressof(gpmSample.contents)
        struct, _, _ = self._gpm_buffers[address]
        self._gpm_buffers[address] = (struct, (index, gpuInstanceId), {pynvml.NVML_GPM_METRIC_SM_UTIL: mig.sm_pct})
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        _, source1, _ = self._gpm_buffers[ctypes.addressof(metricsGet.sample1.contents)]
        _, source2, values = self._gpm_buffers[ctypes.addressof(metricsGet.sample2.contents)]
        if source1 is None or source1 != source2:  # two samples of different GPUs or instances
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId in values:
                metric.value = values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        del self._gpm_buffers[ctypes.addressof(gpmSample.contents)]
