"""MIG instances of a GPU through NVML (`nvidia-ml-py`), read once at discovery: the portal never repartitions.

The calls, as NVIDIA documents them: `nvmlDeviceGetMigMode(handle)` -> (current, pending);
`nvmlDeviceGetMaxMigDeviceCount(handle)` -> how many MIG device slots to walk;
`nvmlDeviceGetMigDeviceHandleByIndex(handle, i)` -> a MIG device handle, or NVMLError NOT_FOUND for an empty slot
(INVALID_ARGUMENT on some drivers), both skipped; on the MIG handle `nvmlDeviceGetUUID` -> "MIG-...",
`nvmlDeviceGetName` -> "NVIDIA A100-SXM4-80GB MIG 1g.10gb" (the profile), `nvmlDeviceGetMemoryInfo` -> its memory,
`nvmlDeviceGetGpuInstanceId` -> the GPU instance id. Takes the `pynvml` module as an argument so tests can give it
a stand-in with the same call shapes and error classes.
"""

from __future__ import annotations

import logging
from typing import Any

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
    # A driver that names MIG devices otherwise: slices and memory from the device attributes.
    attrs = nv.nvmlDeviceGetAttributes(mig)
    return f"{attrs.gpuInstanceSliceCount}g.{-(-memory_mib // 1024)}gb"


def discover_mig_devices(nv: Any, handle: Any) -> tuple[MigDevice, ...]:
    """The MIG instances of one GPU in MIG mode, in slot order. A slot without an instance is skipped; any other
    NVML error is raised (the caller decides whether the GPU is usable)."""
    out: list[MigDevice] = []
    for i in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nv.NVMLError as exc:
            if exc.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        uuid = nv.nvmlDeviceGetUUID(mig)
        memory_mib = int(nv.nvmlDeviceGetMemoryInfo(mig).total // _MIB)
        out.append(
            MigDevice(
                uuid=uuid if isinstance(uuid, str) else uuid.decode(),
                profile=_profile(nv, mig, memory_mib),
                memory_mib=memory_mib,
                gi_id=int(nv.nvmlDeviceGetGpuInstanceId(mig)),
            )
        )
    return tuple(out)
