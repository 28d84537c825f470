"""Prometheus text exposition for /metrics: GPU series under the DCGM exporter's names and labels, so NVIDIA's
Grafana dashboard (and any dashboard built for dcgm-exporter) works against the portal unchanged, plus the
portal's own gauges and counters.

GPU series carry dcgm-exporter's labels: `gpu` (index), `UUID`, `device` (nvidiaN), `modelName` (the driver's
device name), `Hostname` (the node), `DCGM_FI_DRIVER_VERSION`. A GPU without a fresh sample (older than
keys.STALE_AFTER_S) exports no series, as dcgm-exporter exports none for a GPU it cannot read: Prometheus then
marks the series stale instead of repeating an old value.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db.models import Count

from apps.core.redis import get_redis
from apps.fleet.models import Gpu, GpuStatus, Node, NodeStatus
from apps.telemetry.selectors import all_latest_samples, is_stale, stats

# (metric, type, help, function of the latest sample -> value or None)
DCGM_SERIES: tuple[tuple[str, str, str, Any], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda s: s.get("util")),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda s: s.get("mem_used")),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda s: None if s.get("mem_total") is None or s.get("mem_used") is None else s["mem_total"] - s["mem_used"],
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda s: s.get("temp")),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda s: s.get("power")),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda s: s.get("sm_clock")),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda s: s.get("tensor"),
    ),
)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in pairs) + "}"


def fmt(value: float | int) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _queue_lengths(names: Iterable[str]) -> dict[str, int]:
    try:
        pipe = get_redis().pipeline(transaction=False)
        names = list(names)
        for name in names:
            pipe.llen(name)
        return dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
    except Exception:
        return {}


def render(*, now: float | None = None) -> str:
    """The whole exposition (one DB query for the GPUs, two counts, three Redis calls)."""
    now = time.time() if now is None else now
    out: list[str] = []
    gpus = list(
        Gpu.objects.filter(retired_at__isnull=True)
        .select_related("node", "model")
        .only("uuid", "index", "name", "model__name", "node__name", "node__driver_version")
        .order_by("node__name", "index")
    )
    try:
        latest = all_latest_samples()
        counters = stats()
    except Exception:  # Redis down: the portal gauges still tell the story
        latest, counters = {}, {}

    series: list[tuple[list[tuple[str, str]], dict[str, Any]]] = []
    for gpu in gpus:
        sample: Any = latest.get(gpu.uuid)
        if sample is None or is_stale(sample, now=now):
            continue
        label_pairs = [
            ("gpu", str(gpu.index)),
            ("UUID", gpu.uuid),
            ("device", f"nvidia{gpu.index}"),
            ("modelName", gpu.name or gpu.model.name),
            ("Hostname", gpu.node.name),
            ("DCGM_FI_DRIVER_VERSION", gpu.node.driver_version or ""),
        ]
        series.append((label_pairs, dict(sample)))
    for name, kind, help_text, value_of in DCGM_SERIES:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for label_pairs, sample in series:
            value = value_of(sample)
            if value is not None:
                out.append(f"{name}{labels(label_pairs)} {fmt(value)}")

    node_counts = dict(Node.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    out += ["# HELP gpuportal_nodes Nodes by status.", "# TYPE gpuportal_nodes gauge"]
    for value in NodeStatus.values:
        out.append(f"gpuportal_nodes{labels([('status', value)])} {node_counts.get(value, 0)}")
    gpu_counts = dict(
        Gpu.objects.filter(retired_at__isnull=True)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    out += ["# HELP gpuportal_gpus GPUs by status.", "# TYPE gpuportal_gpus gauge"]
    for value in GpuStatus.values:
        out.append(f"gpuportal_gpus{labels([('status', value)])} {gpu_counts.get(value, 0)}")
    out += [
        "# HELP gpuportal_gpus_reporting GPUs with a sample in the last 10 s.",
        "# TYPE gpuportal_gpus_reporting gauge",
        f"gpuportal_gpus_reporting {len(series)}",
    ]

    out += [
        "# HELP gpuportal_telemetry_messages_total Agent telemetry messages by outcome.",
        "# TYPE gpuportal_telemetry_messages_total counter",
    ]
    for result, key in (
        ("accepted", "messages_accepted"),
        ("rejected", "messages_rejected"),
        ("stale", "messages_stale"),
    ):
        out.append(f"gpuportal_telemetry_messages_total{labels([('result', result)])} {counters.get(key, 0)}")
    out += [
        "# HELP gpuportal_telemetry_samples_total GPU samples stored.",
        "# TYPE gpuportal_telemetry_samples_total counter",
        f"gpuportal_telemetry_samples_total {counters.get('samples_accepted', 0)}",
        "# HELP gpuportal_telemetry_rows_rejected_total GPU rows refused inside accepted messages.",
        "# TYPE gpuportal_telemetry_rows_rejected_total counter",
        f"gpuportal_telemetry_rows_rejected_total {counters.get('rows_rejected', 0)}",
        "# HELP gpuportal_agent_rejections_total Agent messages or rows refused, by reason.",
        "# TYPE gpuportal_agent_rejections_total counter",
    ]
    for key in sorted(counters):
        if key.startswith("rejected:"):
            out.append(f"gpuportal_agent_rejections_total{labels([('reason', key[9:])])} {counters[key]}")

    queues = _queue_lengths(["control", "portal"])
    out += ["# HELP gpuportal_queue_length Messages waiting in a Celery queue.", "# TYPE gpuportal_queue_length gauge"]
    for name, length in queues.items():
        out.append(f"gpuportal_queue_length{labels([('queue', name)])} {length}")
    return "\n".join(out) + "\n"
