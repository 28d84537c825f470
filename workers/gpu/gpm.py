"""GPM (GPU Performance Monitoring, Hopper and later) through NVML: a metric is a rate between two samples taken one
tick apart, so each source (a GPU, or one MIG instance of it) keeps two sample buffers and uses them in turn.

The calls, as NVIDIA documents them: `nvmlGpmSampleAlloc()` -> a buffer, freed by `nvmlGpmSampleFree`;
`nvmlGpmSampleGet(device, sample)` for the whole GPU, `nvmlGpmMigSampleGet(device, gpuInstanceId, sample)` for one
MIG instance (the GPU's handle and the instance's GPU instance id); `nvmlGpmMetricsGet(request)` with a
`c_nvmlGpmMetricsGet_t` naming the two samples and the metric ids, each metric answered with its own status.
`nvmlGpmQueryDeviceSupport(device).isSupportedDevice` says whether the GPU has GPM at all (A100 does not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GpmPair:
    """The two buffers of one source. `read` takes a sample into the next buffer and returns the metric between it
    and the previous one: None on the first call (no rate yet). Call `free` once done with it."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        self._turn = 0
        self._primed = False

    def read(self, take: Callable[[Any], object], metric_id: int) -> float | None:
        """`take(buffer)` fills the buffer (nvmlGpmSampleGet or nvmlGpmMigSampleGet); the metric, 0..100."""
        nv = self._nv
        current = self._samples[self._turn]
        previous = self._samples[1 - self._turn]
        take(current)
        self._turn = 1 - self._turn
        if not self._primed:
            self._primed = True
            return None
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = previous
        request.sample2 = current
        request.metrics[0].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        metric = request.metrics[0]
        if metric.nvmlReturn != nv.NVML_SUCCESS:
            raise nv.NVMLError(metric.nvmlReturn)
        return max(0.0, min(100.0, float(metric.value)))

    def free(self) -> None:
        for buf in self._samples:
            self._nv.nvmlGpmSampleFree(buf)
        self._samples = []


def gpm_supported(nv: Any, handle: Any) -> bool:
    """Whether the GPU has GPM (False on old drivers or bindings without it)."""
    try:
        return bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except (nv.NVMLError, AttributeError):
        return False
