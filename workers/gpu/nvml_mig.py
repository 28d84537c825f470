"""MIG instances of a GPU through NVML (`nvidia-ml-py`), read once at discovery: the portal never repartitions.

The calls, as NVIDIA documents them: `nvmlDeviceGetMigMode(handle)` -> (current, pending);
`nvmlDeviceGetMaxMigDeviceCount(handle)` -> how many MIG device slots to walk;
`nvmlDeviceGetMigDeviceHandleByIndex(handle, i)` -> a MIG device handle, or NVMLError NOT_FOUND for an empty slot
(INVALID_ARGUMENT on some drivers), both skipped; on the MIG handle `nvmlDeviceGetUUID` -> "MIG-...",
`nvmlDeviceGetName` -> "NVIDIA A100-SXM4-80GB MIG 1g.10gb" (the profile; "MIG 1c.3g.40gb" for one of several
compute instances in a GPU instance: each is a MIG device of its own, and they share the GPU instance's memory),
`nvmlDeviceGetMemoryInfo` -> its memory,
`nvmlDeviceGetGpuInstanceId` -> the GPU instance id. Each tick the agent reads `nvmlDeviceGetMemoryInfo` on every
instance's handle for the memory it uses, and on a GPU with GPM (Hopper and later) each instance's SM activity
through `nvmlGpmMigSampleGet(GPU handle, GPU instance id, sample)` (`workers.gpu.gpm`): NVML has no utilization for
an instance otherwise, and the other counters are the whole GPU's. Takes the `pynvml` module as an argument so
tests can give it a stand-in with the same call shapes and error classes.
"""

from __future__ import annotations

import logging
from typing import Any

from workers.gpu.gpm import GpmPair
from workers.gpu.mig import MigDevice, profile_from_device_name

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024


def mig_enabled(nv: Any, handle: Any) -> bool:
    """Whether the GPU runs in MIG mode now (a pending change counts after the next GPU reset, not before); False
    on boards without MIG (NOT_SUPPORTED)."""
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except nv.NVMLError as exc:
        if exc.value != nv.NVML_ERROR_NOT_SUPPORTED:
            logger.warning("reading MIG mode failed: %s", exc)
        return False
    return bool(current == nv.NVML_DEVICE_MIG_ENABLE)


def _profile(nv: Any, mig: Any, memory_mib: int) -> str:
    name = nv.nvmlDeviceGetName(mig)
    found = profile_from_device_name(name)
    if found:
        return found
    # A driver that names MIG devices otherwise: slices and memory from the device attributes. A compute instance
    # with fewer slices than its GPU instance is named as NVIDIA does ("1c.3g.40gb"), so it bills at its own
    # slices rather than its GPU instance's (two such siblings would otherwise bill the GPU instance twice).
    attrs = nv.nvmlDeviceGetAttributes(mig)
    g, c = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
    base = f"{g}g.{-(-memory_mib // 1024)}gb"
    return f"{c}c.{base}" if 0 < c < g else base


def discover_mig_devices(nv: Any, handle: Any) -> tuple[MigDevice, ...]:
    """The MIG instances of one GPU in MIG mode, in slot order. A slot without an instance is skipped; any other
    NVML error is raised (the caller decides whether the GPU is usable)."""
    return tuple(device for device, _ in discover_mig_handles(nv, handle))


def discover_mig_handles(nv: Any, handle: Any) -> list[tuple[MigDevice, Any]]:
    """`discover_mig_devices` with each instance's NVML handle, which the agent keeps to read its memory."""
    out: list[tuple[MigDevice, Any]] = []
    for i in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nv.NVMLError as exc:
            if exc.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        uuid = nv.nvmlDeviceGetUUID(mig)
        memory_mib = int(nv.nvmlDeviceGetMemoryInfo(mig).total // _MIB)
        device = MigDevice(
            uuid=uuid if isinstance(uuid, str) else uuid.decode(),
            profile=_profile(nv, mig, memory_mib),
            memory_mib=memory_mib,
            gi_id=int(nv.nvmlDeviceGetGpuInstanceId(mig)),
        )
        out.append((device, mig))
    return out


def read_mig_memory(nv: Any, instances: list[tuple[MigDevice, Any]]) -> tuple[dict[str, int], list[str]]:
    """Memory used (MiB) by each instance, by its `MIG-` uuid, and an error text per instance that could not be
    read (left out of the map: unknown is not zero). GPU_IS_LOST is raised, as for any read of the GPU."""
    used: dict[str, int] = {}
    errors: list[str] = []
    for device, mig in instances:
        try:
            used[device.uuid] = int(nv.nvmlDeviceGetMemoryInfo(mig).used // _MIB)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED):
                raise
            errors.append(f"{device.uuid}: {exc}")
    return used, errors


def read_mig_sm(
    nv: Any, handle: Any, instances: list[tuple[MigDevice, Any]], pairs: dict[str, GpmPair]
) -> tuple[dict[str, int], list[str]]:
    """SM activity (% of the instance's SMs busy, GPM's `NVML_GPM_METRIC_SM_UTIL`) of each instance, by its uuid,
    between this tick and the last, and an error text per instance that could not be read. `pairs` keeps each
    instance's two GPM buffers (made here on its first read; an instance has no figure until its second).
    NOT_SUPPORTED (no GPM for instances on this GPU), GPU_IS_LOST and RESET_REQUIRED are raised."""
    busy: dict[str, int] = {}
    errors: list[str] = []
    for device, _mig in instances:
        pair = pairs.get(device.uuid)
        if pair is None:
            pair = pairs[device.uuid] = GpmPair(nv)

        def take(buf: Any, gi: int = device.gi_id) -> object:
            return nv.nvmlGpmMigSampleGet(handle, gi, buf)

        try:
            value = pair.read(take, nv.NVML_GPM_METRIC_SM_UTIL)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (
                nv.NVML_ERROR_NOT_SUPPORTED,
                nv.NVML_ERROR_GPU_IS_LOST,
                nv.NVML_ERROR_RESET_REQUIRED,
            ):
                raise
            errors.append(f"{device.uuid}: {exc}")
            continue
        if value is not None:
            busy[device.uuid] = round(value)
    return busy, errors
