"""Prometheus exposition for /metrics: GPU series under the DCGM exporter's names and labels, so NVIDIA's Grafana
dashboard (and any dashboard built for dcgm-exporter) works against the portal unchanged, plus the portal's own
gauges and counters.

A custom prometheus-client collector builds every family at scrape time from the database and Redis: the values
live there (agents report to any web process), not in this process's memory, so there is nothing to keep in
prometheus-client's own metric objects.

GPU series carry dcgm-exporter's labels: `gpu` (index), `UUID`, `device` (nvidiaN), `modelName` (the driver's
device name), `Hostname` (the node), `DCGM_FI_DRIVER_VERSION`, and `instance` (the node): one portal stands in for
one dcgm-exporter per node, so a Prometheus job with `honor_labels: true` keeps a per-node `instance` and the
dashboards' node picker and legends work on a fleet (docs/monitoring.md). `render(node=...)` exports one node's GPU
series alone, for Prometheus' HTTP service discovery (apps.telemetry.views.metrics_targets). A GPU without a fresh
sample (older than keys.STALE_AFTER_S) exports no series, as dcgm-exporter exports none for a GPU it cannot read:
Prometheus then marks the series stale instead of repeating an old value.

The GPU families are written here rather than through prometheus-client, because dcgm-exporter's counters have no
`_total` suffix and prometheus-client would add one to their HELP and TYPE lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from django.db.models import Count
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from apps.core.redis import get_redis
from apps.fleet.models import DeviceKind, Gpu, GpuStatus, Node, NodeStatus
from apps.fleet.selectors import gpu_holders
from apps.telemetry.keys import OUTSIDE_USE_MIB
from apps.telemetry.outside import outside_use
from apps.telemetry.selectors import all_latest_samples, is_stale, stats

Sample = Mapping[str, Any]


def _fb_free(sample: Sample) -> Any:
    if sample.get("mem_total") is None or sample.get("mem_used") is None:
        return None
    return sample["mem_total"] - sample["mem_used"]


def _counter(key: str, scale: int = 1) -> Callable[[Sample], Any]:
    def value(s: Sample) -> Any:
        v = (s.get("counters") or {}).get(key)
        return None if v is None else v * scale

    return value


def _health(key: str) -> Callable[[Sample], Any]:
    """A health counter: the agent sends only values that signal a problem, so a sample with device counters but
    without this key means 0. A sample without any (an older agent) exports no series."""
    return lambda s: None if "counters" not in s else s["counters"].get(key, 0)


# (metric, type, help, function of the latest sample -> value or None): dcgm-exporter's names, types and help
# texts (its default-counters.csv) for every field the agents read through NVML.
DCGM_SERIES: tuple[tuple[str, str, str, Callable[[Sample], Any]], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda s: s.get("sm_clock")),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _counter("mc")),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _counter("mt")),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda s: s.get("temp")),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda s: s.get("power")),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        _counter("en"),
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", _counter("prc")),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda s: s.get("util")),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", _health("last_xid")),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _fb_free),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda s: s.get("mem_used")),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        _counter("nvl"),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        _health("remap_unc"),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        _health("remap_cor"),
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", _health("remap_fail")),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda s: s.get("tensor"),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in "
        "bytes per second.",
        _counter("ptx", 1024),  # KB/s from NVML
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes "
        "per second.",
        _counter("prx", 1024),
    ),
)
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "instance")
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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def dcgm_text(series: list[tuple[list[str], Sample]]) -> str:
    """The GPU families in text format 0.0.4: every family with HELP and TYPE, a series per GPU that has a value."""
    lines: list[str] = []
    label_parts = [
        ",".join(f'{name}="{_escape(value)}"' for name, value in zip(DCGM_LABELS, label_values, strict=True))
        for label_values, _ in series
    ]
    for name, kind, help_text, value_of in DCGM_SERIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, (_, sample) in zip(label_parts, series, strict=True):
            value = value_of(sample)
            if value is not None:  # a null reading: no series, not a fake zero
                lines.append(f"{name}{{{labels}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def gpu_series(*, now: float, node: str | None = None) -> list[tuple[list[str], Sample]]:
    """(dcgm-exporter's label values, the latest sample) of every GPU with a fresh sample (of one node when given);
    empty when Redis is unreachable."""
    try:
        latest = all_latest_samples()
    except Exception:
        return []
    gpus = Gpu.objects.filter(retired_at__isnull=True)
    if node is not None:
        gpus = gpus.filter(node__name=node)
    rows = gpus.order_by("node__name", "index").values_list(
        "uuid", "index", "name", "model__name", "node__name", "node__driver_version"
    )
    out: list[tuple[list[str], Sample]] = []
    for uuid, index, name, model_name, hostname, driver_version in rows:
        sample = latest.get(uuid)
        if sample is None or is_stale(sample, now=now):
            continue
        labels = [str(index), uuid, f"nvidia{index}", name or model_name, hostname, driver_version or "", hostname]
        out.append((labels, sample))
    return out


MIG_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_ID", "GPU_I_PROFILE", "instance")
MIG_SERIES = (
    ("gpuportal_mig_instance_memory_mib", "MIG instance memory (in MiB), as its profile gives it."),
    ("gpuportal_mig_instance_memory_used_mib", "MIG instance memory used (in MiB), from its GPU's latest sample."),
    (
        "gpuportal_mig_instance_sm_active",
        "Ratio of the MIG instance's SMs busy (as DCGM_FI_PROF_SM_ACTIVE), from GPM on GPUs that have it.",
    ),
    ("gpuportal_mig_instance_allocated", "1 while a reservation or job holds the MIG instance."),
)


def mig_text(*, node: str | None = None, fresh: Mapping[str, Sample] | None = None) -> str:
    """MIG instances under dcgm-exporter's convention: the GPU's `gpu`, `UUID` and `device` labels with `GPU_I_ID`
    and `GPU_I_PROFILE`, so dashboards can join them to the GPU's series. What the portal knows of an instance (its
    memory, what it uses when its GPU's sample is fresh, whether it is held, and its SM activity where GPM gives it:
    Hopper and later). `fresh`: the GPUs' fresh latest samples, by uuid (`gpu_series`)."""
    parts = Gpu.devices.filter(kind=DeviceKind.MIG, retired_at__isnull=True, parent__retired_at__isnull=True)
    if node is not None:
        parts = parts.filter(parent__node__name=node)
    rows = list(
        parts.order_by("parent__node__name", "parent__index", "gi_id").values_list(
            "uuid", "parent__index", "parent__uuid", "parent__name", "model__name", "parent__node__name", "gi_id",
            "mig_profile", "memory_mib",
        )
    )  # fmt: skip
    if not rows:
        return ""
    held = gpu_holders()
    used = {
        instance: mib
        for parent in {row[2] for row in rows}
        for instance, mib in (fresh or {}).get(parent, {}).get("mig_mem", {}).items()
    }
    busy = {
        instance: pct
        for parent in {row[2] for row in rows}
        for instance, pct in (fresh or {}).get(parent, {}).get("mig_util", {}).items()
    }
    lines: list[str] = []
    for name, help_text in MIG_SERIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for uuid, index, parent_uuid, gpu_name, model, host, gi_id, profile, memory in rows:
            values = [
                str(index),
                parent_uuid,
                f"nvidia{index}",
                gpu_name or model,
                host,
                str(gi_id or 0),
                profile,
                host,
            ]
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(MIG_LABELS, values, strict=True))
            if name.endswith(("used_mib", "sm_active")):
                reading = used.get(uuid) if name.endswith("used_mib") else busy.get(uuid)
                if reading is None:  # no fresh reading: no series, not a fake zero
                    continue
                value = reading if name.endswith("used_mib") else round(reading / 100, 2)
            else:
                value = memory if name.endswith("memory_mib") else int(uuid in held)
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


class PortalCollector:
    """The portal's own families, read fresh on every collect (two counts, three Redis calls). `reporting` is the
    number of GPUs with a fresh sample (the GPU series are written by dcgm_text)."""

    def __init__(self, *, reporting: int) -> None:
        self.reporting = reporting

    def collect(self) -> Iterator[Metric]:
        try:
            counters = stats()
        except Exception:  # Redis down: the portal gauges still tell the story
            counters = {}
        yield from self._fleet_families(reporting=self.reporting)
        yield from self._telemetry_families(counters)
        queues = GaugeMetricFamily("gpuportal_queue_length", "Messages waiting in a Celery queue.", labels=["queue"])
        for name, length in _queue_lengths(QUEUES).items():
            queues.add_metric([name], length)
        yield queues

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


OUTSIDE_SERIES = (
    "gpuportal_gpu_memory_used_outside_mib",
    "Memory used (in MiB) on a whole GPU nothing in the portal holds nor released in the last minute: processes "
    "started outside the portal, or left behind (1024 MiB and more; no series otherwise). A GPU's series, with "
    "its node's.",
)


def outside_text(series: list[tuple[list[str], Sample]], *, now: float) -> str:
    """The GPUs in use outside the portal (apps.telemetry.outside) under the GPU's dcgm-exporter labels, so an alert
    can name the GPU someone uses by hand. Not whose processes: user names as label values are for the pages, where
    they are redacted per viewer. One query (and the outside reads) only while some GPU uses that much memory."""
    loaded = {labels[1]: int(s["mem_used"]) for labels, s in series if (s.get("mem_used") or 0) >= OUTSIDE_USE_MIB}
    if not loaded:
        return ""
    held = gpu_holders()
    whole = Gpu.objects.filter(uuid__in=list(loaded), mig_mode=False, shares=1).values_list("uuid", "id")
    outside = outside_use({uuid: (gid, loaded[uuid]) for uuid, gid in whole if uuid not in held}, now=now)
    if not outside:
        return ""
    name, help_text = OUTSIDE_SERIES
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, _ in series:
        if labels[1] in outside:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(DCGM_LABELS, labels, strict=True))
            lines.append(f"{name}{{{text}}} {outside[labels[1]]['mib']}")
    return "\n".join(lines) + "\n"


def render(*, now: float | None = None, node: str | None = None) -> str:
    """The whole exposition, in Prometheus' text format 0.0.4; with `node`, that node's GPU series alone (one
    service-discovery target per node: the portal's own families come from the target without `node`)."""
    now = time.time() if now is None else now
    series = gpu_series(now=now, node=node)
    fresh = {labels[1]: sample for labels, sample in series}  # labels[1] is the GPU's UUID
    gpus = dcgm_text(series) + outside_text(series, now=now)
    if node is not None:
        return gpus + mig_text(node=node, fresh=fresh)
    return gpus + mig_text(fresh=fresh) + generate_latest(PortalCollector(reporting=len(series))).decode()


def render_portal(*, now: float | None = None) -> str:
    """The portal's own families alone (the service-discovery target that goes with the per-node ones)."""
    reporting = len(gpu_series(now=time.time() if now is None else now))
    return generate_latest(PortalCollector(reporting=reporting)).decode()
