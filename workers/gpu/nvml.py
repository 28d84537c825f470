"""GPU telemetry from NVML (the `nvidia-ml-py` package, module `pynvml`).

Cost model, which shapes everything here: NVML calls serialize through the driver, and a node agent that polls
too eagerly steals time from the jobs it watches. So per GPU per tick each metric is read exactly once
(utilization, memory, temperature, power, SM clock, and on GPUs with GPM also one GPM sample); the slow calls
(per-process memory, ~5 ms each; the ECC counter) run every `slow_every_s` seconds (default 10) on one shared
tick, so a message either has processes for all GPUs or for none.

Health, realistically:
- ECC: the volatile (since driver load) uncorrected/double-bit count, `nvmlDeviceGetTotalEccErrors`. Read on the
  slow tick; boards without ECC (or with it disabled) answer NOT_SUPPORTED and are not asked again.
- Xid: critical Xid errors arrive as NVML events. One event set for all GPUs is created at discovery; each tick
  drains it with a zero timeout (one call per node per tick when nothing happened; NVML answers TIMEOUT). This is
  how NVIDIA's Kubernetes device plugin watches Xids. `health["xid"]` counts events since the agent started and
  `health["last_xid"]` keeps the latest code (79 = fallen off the bus, 48 = double-bit ECC, 13/31/43/45 are
  usually the application's fault). Retired pages are not polled: the call is slow and ECC already says it.
- Lost: NVML_ERROR_GPU_IS_LOST (or RESET_REQUIRED) from any call marks that GPU lost for the life of the backend
  (the driver needs a reset or reboot, after which the agent restarts anyway). A lost GPU is no longer called;
  its samples carry `health["lost"] = True` and an error, and the other GPUs carry on.
- NVML_ERROR_NOT_SUPPORTED for a metric makes that field None and the call is never made again for that GPU
  (e.g. utilization under MIG, power on some boards). Any other NVMLError makes the field None for this tick only.

Device counters (`GpuSample.counters`, the dcgm-exporter defaults NVML gives): energy since the driver loaded and
one `nvmlDeviceGetFieldValues` call (memory temperature, NVLink data TX and RX) every tick; the memory clock, the PCIe
throughput (each `nvmlDeviceGetPcieThroughput` samples the link for 20 ms), the PCIe replay counter and the remapped
rows (`health["remap_cor"]`, `["remap_unc"]`, `["remap_fail"]`) on the slow tick, their last value repeated in
between. A counter the board lacks (no HBM sensor, no NVLink, no row remapping before Ampere) is left out.

Tensor activity comes from GPM (GPU Performance Monitoring, Hopper and later; `workers.gpu.gpm`): two GPM samples
one tick apart give `NVML_GPM_METRIC_ANY_TENSOR_UTIL`. Older GPUs report None; DCGM's profiling counters are the
alternative there and are out of scope for a dependency-light agent. A GPU in MIG mode has no utilization of its
own (NVML answers NOT_SUPPORTED); with GPM, each instance's SM activity (`NVML_GPM_METRIC_SM_UTIL` from
`nvmlGpmMigSampleGet`) is read instead, the one utilization figure an instance has (`GpuSample.mig_util`).

Per-process utilization (`GpuSample.process_util`), on the slow tick with the processes: the GPU's utilization
does not say which of the jobs sharing it (a GPU split in shares) computes and which only holds memory.
`nvmlDeviceGetProcessUtilization(handle, last_seen)` gives the driver's samples of each process's SM
utilization newer than the last one seen (a CPU timestamp in µs): a process's figure is the mean of its samples,
0 for a listed process with none (it ran no kernel; NVML then answers NOT_FOUND when no process has any). It is
the same reading `nvidia-smi pmon` shows. GPUs in MIG mode answer NOT_SUPPORTED (GPM covers their instances).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

from workers.gpu.base import HEALTH_OK, GpuInfo, GpuSample
from workers.gpu.gpm import GpmPair, gpm_supported
from workers.gpu.mig import MigDevice
from workers.gpu.nvml_mig import discover_mig_handles, read_mig_memory, read_mig_sm
from workers.gpu.specs import model_key_for

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_MAX_EVENTS_PER_TICK = 32  # a storm of Xids must not turn one tick into an unbounded loop

# Metric names, used both as the keys of "not supported" memory and in error texts.
UTIL = "utilization"
MEMORY = "memory"
TEMPERATURE = "temperature"
POWER = "power"
SM_CLOCK = "sm_clock"
TENSOR = "tensor_active"
PROCESSES = "processes"
PROCESS_UTIL = "process_util"
ECC = "ecc_dbe"
ENERGY = "energy"
FIELDS = "field_values"
MEM_CLOCK = "mem_clock"
PCIE_TX = "pcie_tx"
PCIE_RX = "pcie_rx"
PCIE_REPLAY = "pcie_replay"
REMAP = "remapped_rows"
MIG_MEMORY = "mig_memory"
MIG_SM = "mig_sm_activity"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no package, no driver, no library, no permission)."""


class _GpuLost(Exception):
    """Internal: a call answered GPU_IS_LOST; unwinds the rest of this GPU's reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Gpu:
    """Per-GPU state the backend keeps between ticks."""

    def __init__(self, info: GpuInfo, handle: Any) -> None:
        self.info = info
        self.handle = handle
        self.unsupported: set[str] = set()
        self.lost_error: str | None = None
        self.health: dict[str, Any] = dict(HEALTH_OK)
        self.gpm: GpmPair | None = None  # tensor activity (GPM, not in MIG mode)
        self.mig_gpm: dict[str, GpmPair] | None = None  # MIG mode with GPM: SM activity per instance uuid
        self.counters: dict[str, int] = {}  # base.COUNTER_KEYS, slow ones kept between their reads
        self.mig_handles: list[tuple[MigDevice, Any]] = []  # its MIG instances and their handles (MIG mode)
        self.process_util_seen = 0  # newest per-process utilization sample read (driver timestamp, µs)


def _field_value(nv: Any, field: Any) -> float | None:
    """The number in one c_nvmlFieldValue_t, None when the driver could not read that field."""
    if field.nvmlReturn != nv.NVML_SUCCESS:
        return None
    kind = field.valueType
    if kind == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(field.value.dVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(field.value.uiVal)
    if kind == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(field.value.sllVal)
    return int(field.value.ullVal)


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # the agent can run simulated without NVML; say what to install
        raise NvmlUnavailable("the NVML bindings are not installed: pip install nvidia-ml-py") from exc
    return pynvml


class NvmlBackend:
    """GpuBackend over NVML. Initializes NVML once in the constructor; `close()` shuts it down."""

    def __init__(
        self,
        *,
        slow_every_s: float = 10.0,
        tensor_active: bool = True,
        nvml: Any | None = None,
    ) -> None:
        self._nv = nvml if nvml is not None else _import_pynvml()
        self._slow_every_s = slow_every_s
        self._want_tensor = tensor_active
        self._gpus: list[_Gpu] | None = None
        self._by_uuid: dict[str, _Gpu] = {}
        self._event_set: Any | None = None
        self._last_slow: float = -math.inf
        self._closed = False
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            hint = {
                self._nv.NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: is the NVIDIA driver "
                "installed (and, in a container, is the NVIDIA Container Toolkit mounting it)?",
                self._nv.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded (nvidia-smi fails too)",
                self._nv.NVML_ERROR_NO_PERMISSION: "no permission to open /dev/nvidia* for this user",
                self._nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver library and kernel module versions differ "
                "(reboot after a driver upgrade)",
            }.get(code, "see nvidia-smi for the driver's own diagnosis")
            raise NvmlUnavailable(f"NVML initialization failed: {exc} (NVML error {code}); {hint}") from exc

    # -- discovery -------------------------------------------------------------------------------------------

    def discover(self) -> list[GpuInfo]:
        """Enumerate the GPUs once; later calls return the same list (hot-plug is not a thing on these nodes)."""
        if self._gpus is None:
            self._gpus = self._enumerate()
            self._by_uuid = {g.info.uuid: g for g in self._gpus}
            self._setup_xid_events()
        return [g.info for g in self._gpus]

    def _enumerate(self) -> list[_Gpu]:
        nv = self._nv
        try:
            driver = nv.nvmlSystemGetDriverVersion()
        except nv.NVMLError:
            driver = None
        gpus: list[_Gpu] = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = nv.nvmlDeviceGetUUID(handle)
            name = nv.nvmlDeviceGetName(handle)
            memory_mib = int(nv.nvmlDeviceGetMemoryInfo(handle).total // _MIB)
            mig, mig_handles, _ok = self._read_mig(handle, index)
            has_gpm = gpm_supported(nv, handle)
            gpm = self._want_tensor and not mig and has_gpm
            info = GpuInfo(
                uuid=uuid,
                index=index,
                name=name,
                model=model_key_for(name, memory_mib),
                memory_mib=memory_mib,
                mig_mode=mig,
                mig_devices=tuple(device for device, _ in mig_handles),
                extra={"driver_version": driver, "tensor_active_source": "gpm" if gpm else None},
            )
            gpu = _Gpu(info, handle)
            gpu.mig_handles = mig_handles
            if gpm:
                gpu.gpm = GpmPair(nv)
            else:
                gpu.unsupported.add(TENSOR)
            if has_gpm:
                gpu.mig_gpm = {}  # buffers made for each instance as it is first read
            gpus.append(gpu)
        return gpus

    def _read_mig(self, handle: Any, index: int) -> tuple[bool, list[tuple[MigDevice, Any]], bool]:
        """(MIG mode, its instances with their handles, whether both were read without error)."""
        nv = self._nv
        mig = False
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
            mig = current == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_NOT_SUPPORTED:  # pre-Ampere boards have no MIG: not news
                return False, [], True
            logger.warning("GPU %d: reading MIG mode failed: %s", index, exc)
            return False, [], False
        if not mig:
            return False, [], True
        try:
            return True, discover_mig_handles(nv, handle), True
        except nv.NVMLError as exc:
            logger.warning("GPU %d: reading its MIG instances failed: %s", index, exc)
            return True, [], False

    def refresh_layout(self) -> bool:
        """`LayoutRefresh`: MIG mode and instances read again for every GPU (a few NVML calls per GPU; the agent
        calls it every half minute), so a layout an admin changed with mig-parted under the running agent is
        reported without a restart. A GPU whose reading fails keeps its layout."""
        if self._gpus is None:
            self.discover()
            return False
        changed = False
        for gpu in self._gpus:
            mig, handles, ok = self._read_mig(gpu.handle, gpu.info.index)
            devices = tuple(device for device, _ in handles)
            if not ok or (mig == gpu.info.mig_mode and devices == gpu.info.mig_devices):
                continue
            logger.info(
                "GPU %d: MIG layout changed: %s",
                gpu.info.index,
                ", ".join(d.profile for d in devices) if mig else "MIG mode off",
            )
            gpu.info = dataclasses.replace(gpu.info, mig_mode=mig, mig_devices=devices)
            gpu.mig_handles = handles
            if gpu.mig_gpm:
                for uuid in set(gpu.mig_gpm) - {d.uuid for d in devices}:  # instances gone: their buffers too
                    gpu.mig_gpm.pop(uuid).free()
            changed = True
        return changed

    def _setup_xid_events(self) -> None:
        nv = self._nv
        assert self._gpus is not None
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            logger.info("NVML events unavailable, Xid errors will not be reported: %s", exc)
            return
        registered = 0
        for gpu in self._gpus:
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nv.NVMLError as exc:
                logger.info("GPU %d: Xid events not available: %s", gpu.info.index, exc)
        if registered:
            self._event_set = event_set
        else:
            nv.nvmlEventSetFree(event_set)

    # -- sampling --------------------------------------------------------------------------------------------

    def sample(self, now: float) -> list[GpuSample]:
        """Read every GPU once. A lost or misbehaving GPU yields a sample with `error` set; this never raises."""
        if self._closed:
            raise RuntimeError("NvmlBackend is closed")
        if self._gpus is None:
            self.discover()
        assert self._gpus is not None
        slow = now - self._last_slow >= self._slow_every_s
        if slow:
            self._last_slow = now
        self._drain_xid_events()
        return [self._sample_gpu(gpu, now, slow) for gpu in self._gpus]

    def _sample_gpu(self, gpu: _Gpu, now: float, slow: bool) -> GpuSample:
        errors: list[str] = []
        values: dict[str, Any] = {}
        if gpu.lost_error is None:
            try:
                self._read_all(gpu, slow, values, errors)
            except _GpuLost as lost:
                self._mark_lost(gpu, lost.message)
        if gpu.lost_error is not None:
            return GpuSample(
                uuid=gpu.info.uuid,
                ts=now,
                utilization_pct=None,
                memory_used_mib=None,
                memory_total_mib=None,
                temperature_c=None,
                power_w=None,
                sm_clock_mhz=None,
                tensor_active=None,
                processes=None,
                health=dict(gpu.health),
                error=gpu.lost_error,
            )
        mem = values.get(MEMORY)
        return GpuSample(
            uuid=gpu.info.uuid,
            ts=now,
            utilization_pct=values.get(UTIL),
            memory_used_mib=None if mem is None else int(mem.used // _MIB),
            memory_total_mib=None if mem is None else int(mem.total // _MIB),
            temperature_c=values.get(TEMPERATURE),
            power_w=values.get(POWER),
            sm_clock_mhz=values.get(SM_CLOCK),
            tensor_active=values.get(TENSOR),
            processes=values.get(PROCESSES),
            health=dict(gpu.health),
            error="; ".join(errors) or None,
            process_util=values.get(PROCESS_UTIL) or None,
            counters=dict(gpu.counters),
            mig_memory=values.get(MIG_MEMORY),
            mig_util=values.get(MIG_SM) or None,
        )

    def _read_all(self, gpu: _Gpu, slow: bool, values: dict[str, Any], errors: list[str]) -> None:
        nv = self._nv
        h = gpu.handle
        self._read(gpu, UTIL, lambda: int(nv.nvmlDeviceGetUtilizationRates(h).gpu), values, errors)
        self._read(gpu, MEMORY, lambda: nv.nvmlDeviceGetMemoryInfo(h), values, errors)
        self._read(
            gpu, TEMPERATURE, lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), values, errors
        )
        self._read(gpu, POWER, lambda: round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1), values, errors)
        self._read(gpu, SM_CLOCK, lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)), values, errors)
        self._read(gpu, TENSOR, lambda: self._read_gpm(gpu), values, errors)
        if gpu.mig_handles:
            self._read(gpu, MIG_MEMORY, lambda: self._read_mig_memory(gpu, errors), values, errors)
            if gpu.mig_gpm is not None:
                self._read(gpu, MIG_SM, lambda: self._read_mig_sm(gpu, errors), values, errors)
        if slow:
            procs = self._read(gpu, PROCESSES, lambda: self._read_processes(h), values, errors)
            if procs and not gpu.mig_handles:
                self._read(gpu, PROCESS_UTIL, lambda: self._read_process_util(gpu, procs), values, errors)
            ecc = self._read(
                gpu,
                ECC,
                lambda: int(
                    nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
                ),
                values,
                errors,
            )
            if ECC in gpu.unsupported:
                gpu.health["ecc_dbe"] = None
            elif ecc is not None:  # a failed read keeps the last known count rather than forgetting it
                gpu.health["ecc_dbe"] = ecc
        self._read_counters(gpu, slow, values, errors)

    def _read_counters(self, gpu: _Gpu, slow: bool, values: dict[str, Any], errors: list[str]) -> None:
        """The device counters (see the module docstring) into `gpu.counters` and the remap keys of `gpu.health`."""
        nv = self._nv
        h = gpu.handle
        c = gpu.counters
        energy = self._read(gpu, ENERGY, lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(h)), values, errors)
        if energy is not None:
            c["en"] = energy
        fields = self._read(gpu, FIELDS, lambda: self._read_fields(h), values, errors)
        if fields:
            c.update(fields)
        if not slow:
            return
        for metric, key, call in (
            (MEM_CLOCK, "mc", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            (PCIE_TX, "ptx", lambda: int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))),
            (PCIE_RX, "prx", lambda: int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))),
            (PCIE_REPLAY, "prc", lambda: int(nv.nvmlDeviceGetPcieReplayCounter(h))),
        ):
            value = self._read(gpu, metric, call, values, errors)
            if value is not None:
                c[key] = value
        remap = self._read(gpu, REMAP, lambda: nv.nvmlDeviceGetRemappedRows(h), values, errors)
        if remap is not None:
            corrected, uncorrected, _pending, failed = remap
            gpu.health.update(remap_cor=int(corrected), remap_unc=int(uncorrected), remap_fail=bool(failed))

    def _read_mig_memory(self, gpu: _Gpu, errors: list[str]) -> dict[str, int]:
        used, failed = read_mig_memory(self._nv, gpu.mig_handles)
        errors.extend(f"{MIG_MEMORY} {text}" for text in failed)
        return used

    def _read_mig_sm(self, gpu: _Gpu, errors: list[str]) -> dict[str, int]:
        assert gpu.mig_gpm is not None
        busy, failed = read_mig_sm(self._nv, gpu.handle, gpu.mig_handles, gpu.mig_gpm)
        errors.extend(f"{MIG_SM} {text}" for text in failed)
        return busy

    def _read_fields(self, handle: Any) -> dict[str, int]:
        """Memory temperature and NVLink traffic in one call; each field has its own status (no HBM sensor, no
        NVLink: that field is left out)."""
        nv = self._nv
        ids = (
            nv.NVML_FI_DEV_MEMORY_TEMP,
            nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        got = [_field_value(nv, v) for v in nv.nvmlDeviceGetFieldValues(handle, list(ids))]
        out: dict[str, int] = {}
        if got[0] is not None:
            out["mt"] = int(got[0])
        if got[1] is not None and got[2] is not None:
            out["nvl"] = int(got[1] + got[2])
        return out

    def _read(self, gpu: _Gpu, metric: str, call: Callable[[], Any], values: dict[str, Any], errors: list[str]) -> Any:
        """One NVML read with the error policy of this module; stores and returns the value (None on failure)."""
        if metric in gpu.unsupported:
            return None
        nv = self._nv
        try:
            value = call()
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED):
                raise _GpuLost(f"{metric}: {exc}") from exc
            if code == nv.NVML_ERROR_NOT_SUPPORTED:
                # Remember: asking again every second would only cost driver time for the same answer.
                gpu.unsupported.add(metric)
                logger.info("GPU %d (%s): %s not supported, no longer read", gpu.info.index, gpu.info.uuid, metric)
            else:
                errors.append(f"{metric}: {exc}")
            value = None
        values[metric] = value
        return value

    def _read_gpm(self, gpu: _Gpu) -> float | None:
        nv = self._nv
        assert gpu.gpm is not None
        value = gpu.gpm.read(lambda buf: nv.nvmlGpmSampleGet(gpu.handle, buf), nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
        # Rounded at the source to what the message carries, so a decoded message equals the sample.
        return None if value is None else round(value / 100.0, 3)

    def _read_processes(self, handle: Any) -> list[tuple[int, int]]:
        procs = self._nv.nvmlDeviceGetComputeRunningProcesses(handle)
        # usedGpuMemory is None where the driver cannot attribute memory (WDDM, some MIG setups): report 0.
        return sorted((int(p.pid), int((p.usedGpuMemory or 0) // _MIB)) for p in procs)

    def _read_process_util(self, gpu: _Gpu, processes: list[tuple[int, int]]) -> dict[int, int]:
        """{pid: mean SM %} for the processes just listed (see the module docstring)."""
        nv = self._nv
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_util_seen)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != nv.NVML_ERROR_NOT_FOUND:
                raise
            samples = []  # no process has run a kernel since the last read
        total: dict[int, int] = {}
        count: dict[int, int] = {}
        newest = gpu.process_util_seen
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= gpu.process_util_seen:
                continue  # the driver may hand back a sample already counted
            newest = max(newest, stamp)
            pid = int(sample.pid)
            total[pid] = total.get(pid, 0) + min(int(sample.smUtil), 100)
            count[pid] = count.get(pid, 0) + 1
        gpu.process_util_seen = newest
        return {pid: round(total[pid] / count[pid]) if pid in count else 0 for pid, _ in processes}

    def _mark_lost(self, gpu: _Gpu, message: str) -> None:
        gpu.lost_error = f"GPU lost ({message})"
        gpu.health["lost"] = True
        logger.error("GPU %d (%s) is lost: %s; it will not be sampled again", gpu.info.index, gpu.info.uuid, message)

    def _drain_xid_events(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        for _ in range(_MAX_EVENTS_PER_TICK):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if exc.value != nv.NVML_ERROR_TIMEOUT:  # TIMEOUT is the normal "no event" answer
                    logger.warning("reading NVML events failed: %s", exc)
                return
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            gpu = self._gpu_for_handle(data.device)
            if gpu is None:
                logger.warning("Xid %d on an unknown device", data.eventData)
                continue
            gpu.health["xid"] = int(gpu.health.get("xid") or 0) + 1
            gpu.health["last_xid"] = int(data.eventData)
            logger.warning("GPU %d (%s): Xid %d", gpu.info.index, gpu.info.uuid, data.eventData)

    def _gpu_for_handle(self, handle: Any) -> _Gpu | None:
        # Handles are pointers to driver-owned structs: the same GPU always yields the same address.
        assert self._gpus is not None
        try:
            address = ctypes.addressof(handle.contents)
            for gpu in self._gpus:
                if ctypes.addressof(gpu.handle.contents) == address:
                    return gpu
        except (ValueError, AttributeError, TypeError):
            pass
        try:  # not comparable as pointers: ask the driver (rare: only when an event arrived)
            return self._by_uuid.get(self._nv.nvmlDeviceGetUUID(handle))
        except self._nv.NVMLError:
            return None

    # -- teardown --------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Free event set and GPM buffers, then shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        nv = self._nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            for gpu in self._gpus or []:
                for pair in [gpu.gpm, *(gpu.mig_gpm or {}).values()]:
                    if pair is not None:
                        pair.free()
        except nv.NVMLError as exc:
            logger.warning("freeing NVML resources failed: %s", exc)
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                logger.warning("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
