"""Prometheus exposition for /metrics: GPU series under the DCGM exporter's names and labels, so NVIDIA's Grafana
dashboard (and any dashboard built for dcgm-exporter) works against the portal unchanged, plus the portal's own
gauges and counters.

A custom prometheus-client collector builds every family at scrape time from the database and Redis: the values
live there (agents report to any web process), not in this process's memory, so there is nothing to keep in
prometheus-client's own metric objects.

GPU series carry dcgm-exporter's labels: `gpu` (index), `UUID`, `device` (nvidiaN), `modelName` (the driver's
device name), `Hostname` (the node), `DCGM_FI_DRIVER_VERSION`. A GPU without a fresh sample (older than
keys.STALE_AFTER_S) exports no series, as dcgm-exporter exports none for a GPU it cannot read: Prometheus then
marks the series stale instead of repeating an old value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from django.db.models import Count
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from apps.core.redis import get_redis
from apps.fleet.models import Gpu, GpuStatus, Node, NodeStatus
from apps.telemetry.selectors import all_latest_samples, is_stale, stats

Sample = Mapping[str, Any]


def _fb_free(sample: Sample) -> Any:
    if sample.get("mem_total") is None or sample.get("mem_used") is None:
        return None
    return sample["mem_total"] - sample["mem_used"]


# (metric, help, function of the latest sample -> value or None); all gauges, as in dcgm-exporter.
DCGM_SERIES: tuple[tuple[str, str, Callable[[Sample], Any]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: s.get("util")),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.get("mem_used")),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.get("temp")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.get("power")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: s.get("sm_clock")),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", lambda s: s.get("tensor")),
)
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
QUEUES = ("control", "portal")


def _queue_lengths(names: Iterable[str]) -> dict[str, int]:
    try:
        pipe = get_redis().pipeline(transaction=False)
        names = list(names)
        for name in names:
            pipe.llen(name)
        return dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
    except Exception:
        return {}


def _counts_by_status(queryset: Any) -> dict[str, int]:
    return dict(queryset.values_list("status").annotate(n=Count("id")).values_list("status", "n"))


class PortalCollector:
    """Everything /metrics shows, read fresh on every collect (one query for the GPUs, two counts, three Redis
    calls). `now` (seconds since the epoch) decides which samples are stale; default the time of the scrape."""

    def __init__(self, *, now: float | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = time.time() if self.now is None else self.now
        try:
            latest = all_latest_samples()
            counters = stats()
        except Exception:  # Redis down: the portal gauges still tell the story
            latest, counters = {}, {}
        series = list(self._gpu_series(latest, now))
        yield from self._dcgm_families(series)
        yield from self._fleet_families(reporting=len(series))
        yield from self._telemetry_families(counters)
        queues = GaugeMetricFamily("gpuportal_queue_length", "Messages waiting in a Celery queue.", labels=["queue"])
        for name, length in _queue_lengths(QUEUES).items():
            queues.add_metric([name], length)
        yield queues

    def _gpu_series(self, latest: Mapping[str, Any], now: float) -> Iterator[tuple[list[str], Sample]]:
        """(dcgm-exporter's label values, the latest sample) of every GPU with a fresh sample."""
        gpus = (
            Gpu.objects.filter(retired_at__isnull=True)
            .order_by("node__name", "index")
            .values_list("uuid", "index", "name", "model__name", "node__name", "node__driver_version")
        )
        for uuid, index, name, model_name, hostname, driver_version in gpus:
            sample = latest.get(uuid)
            if sample is None or is_stale(sample, now=now):
                continue
            yield [str(index), uuid, f"nvidia{index}", name or model_name, hostname, driver_version or ""], sample

    def _dcgm_families(self, series: list[tuple[list[str], Sample]]) -> Iterator[Metric]:
        for name, help_text, value_of in DCGM_SERIES:
            family = GaugeMetricFamily(name, help_text, labels=DCGM_LABELS)
            for label_values, sample in series:
                value = value_of(sample)
                if value is not None:  # a null reading: no series, not a fake zero
                    family.add_metric(label_values, value)
            yield family

    def _fleet_families(self, *, reporting: int) -> Iterator[Metric]:
        node_counts = _counts_by_status(Node.objects.all())
        nodes = GaugeMetricFamily("gpuportal_nodes", "Nodes by status.", labels=["status"])
        for status in NodeStatus.values:
            nodes.add_metric([status], node_counts.get(status, 0))
        yield nodes
        gpu_counts = _counts_by_status(Gpu.objects.filter(retired_at__isnull=True))
        gpus = GaugeMetricFamily("gpuportal_gpus", "GPUs by status.", labels=["status"])
        for status in GpuStatus.values:
            gpus.add_metric([status], gpu_counts.get(status, 0))
        yield gpus
        yield GaugeMetricFamily("gpuportal_gpus_reporting", "GPUs with a sample in the last 10 s.", value=reporting)

    def _telemetry_families(self, counters: Mapping[str, int]) -> Iterator[Metric]:
        messages = CounterMetricFamily(
            "gpuportal_telemetry_messages_total", "Agent telemetry messages by outcome.", labels=["result"]
        )
        for result in ("accepted", "rejected", "stale"):
            messages.add_metric([result], counters.get(f"messages_{result}", 0))
        yield messages
        yield CounterMetricFamily(
            "gpuportal_telemetry_samples_total", "GPU samples stored.", value=counters.get("samples_accepted", 0)
        )
        yield CounterMetricFamily(
            "gpuportal_telemetry_rows_rejected_total",
            "GPU rows refused inside accepted messages.",
            value=counters.get("rows_rejected", 0),
        )
        rejections = CounterMetricFamily(
            "gpuportal_agent_rejections_total", "Agent messages or rows refused, by reason.", labels=["reason"]
        )
        for key in sorted(counters):
            if key.startswith("rejected:"):
                rejections.add_metric([key.removeprefix("rejected:")], counters[key])
        yield rejections


def render(*, now: float | None = None) -> str:
    """The whole exposition, in Prometheus' text format 0.0.4."""
    return generate_latest(PortalCollector(now=now)).decode()
