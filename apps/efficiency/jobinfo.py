"""A job's GPU use over its life (from the minute rollups; the hourly ones once the minutes are pruned), its failure
kind and the advice: for the job API and the job page."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.efficiency import advice
from apps.fleet.models import DeviceKind, Gpu
from apps.jobs.models import Job, JobLogLine
from apps.telemetry.jobmem import job_memory
from apps.telemetry.models import JobMemoryMinute
from apps.telemetry.selectors import gpu_readings
from workers.probes.advisor import RESULT_PREFIX

LOG_LINES_READ = 2000


@dataclass
class JobEfficiency:
    gpu_memory_peak_mib: int | None = None
    gpu_utilization_mean: float | None = None
    failure: str | None = None
    advice: list[dict[str, str]] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    gpu_memory_total_mib: int = 0
    advisor: dict[str, Any] | None = None
    part: str = ""  # the MIG instance or share the job ran on ("" for whole GPUs)


def _floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def job_efficiency(job: Job, *, advice_too: bool = True) -> JobEfficiency:
    """Peak memory, mean utilization, the per-minute series (utilization mean and memory peak over the job's GPUs),
    the failure kind and the advice. Two queries for the rollups and GPUs, one for the log's tail; `advice_too=False`
    (a report's list of jobs, which shows the figures only) leaves out the log, the failure kind and the advice."""
    out = JobEfficiency()
    if job.started_at is None and not job.is_terminal:
        return out  # queued or placing: nothing ran yet (and the submit answer costs no query for it)
    # Every device, MIG instances and shares included (`job.gpus.all()` sees physical GPUs only).
    devices = list(Gpu.devices.filter(jobs=job).select_related("model", "parent"))
    gpus = [d for d in devices if d.parent_id is None]
    parts = [d for d in devices if d.parent_id is not None]
    lines: list[str] = []
    if job.is_terminal and advice_too:
        lines = list(
            JobLogLine.objects.filter(job=job).order_by("-seq").values_list("line", flat=True)[:LOG_LINES_READ]
        )
    out.advisor = advisor_result(lines)
    out.failure = advice.failure_kind(exit_code=job.exit_code, reason=job.reason, message=job.message, log_lines=lines)
    uses: list[advice.GpuUse] = []
    if parts and job.started_at is not None:
        uses = _part_use(job, parts, out)
    elif gpus and job.started_at is not None:
        end = job.ended_at or timezone.now()
        rows = gpu_readings(gpu_ids=[g.pk for g in gpus], start=job.started_at, end=end)
        per_minute: dict[datetime, list[tuple[float | None, int | None]]] = {}
        per_gpu: dict[int, list[tuple[float | None, int | None]]] = {g.pk: [] for g in gpus}
        for gid, minute, util, mem in rows:
            per_minute.setdefault(minute, []).append((util, mem))
            per_gpu[gid].append((util, mem))
        for minute, vals in per_minute.items():
            us = [u for u, _ in vals if u is not None]
            ms = [m for _, m in vals if m is not None]
            out.series.append(
                {
                    "t": minute.isoformat(),
                    "util": round(sum(us) / len(us), 1) if us else None,
                    "mem": max(ms) if ms else None,
                }
            )
        for g in gpus:
            vals = per_gpu[g.pk]
            us = [u for u, _ in vals if u is not None]
            ms = [m for _, m in vals if m is not None]
            uses.append(
                advice.GpuUse(
                    util_mean=sum(us) / len(us) if us else None,
                    mem_peak_mib=max(ms) if ms else None,
                    mem_total_mib=g.memory_mib,
                )
            )
        peaks = [u.mem_peak_mib for u in uses if u.mem_peak_mib is not None]
        utils = [u.util_mean for u in uses if u.util_mean is not None]
        out.gpu_memory_peak_mib = max(peaks) if peaks else None
        out.gpu_utilization_mean = round(sum(utils) / len(utils), 1) if utils else None
        out.gpu_memory_total_mib = max(g.memory_mib for g in gpus)
    if not advice_too or (not rows_seen(uses) and out.failure is None):
        return out
    model = devices[0].model.name if devices else ""
    items = advice.advise(
        gpus=[u for u in uses if u.mem_peak_mib is not None or u.util_mean is not None],
        gpu_count=job.gpu_count,
        model=model,
        failure=out.failure,
        memory_mib=job.memory_mib,
        part=out.part,
        shared=bool(parts) and parts[0].kind == DeviceKind.SHARE,
    )
    out.advice = [a.as_dict() for a in items]
    return out


def _part_use(job: Job, parts: list[Gpu], out: JobEfficiency) -> list[advice.GpuUse]:
    """A MIG instance's or share's job: what its node attributes to the job itself, per minute from
    `JobMemoryMinute` (the GPU's readings are its neighbours' too): its memory against the part's own, the peak
    from its own readings, and its SM activity (its processes' per-process utilization, or its instance's GPM
    reading). A minute without the job's own activity (a node that cannot read it) takes the GPU's utilization,
    as the best there is. Fills `out`."""
    parent_ids = sorted({p.parent_id for p in parts if p.parent_id is not None})
    end = job.ended_at or timezone.now()
    assert job.started_at is not None
    per_minute: dict[datetime, list[float]] = {}
    for _, minute, util, _ in gpu_readings(gpu_ids=parent_ids, start=job.started_at, end=end):
        if util is not None:
            per_minute.setdefault(minute, []).append(util)
    own_minutes: dict[datetime, int] = {}
    own_busy: dict[datetime, list[float]] = {}
    for minute, mib, busy in JobMemoryMinute.objects.filter(
        job=job, minute__gte=_floor(job.started_at), minute__lte=end
    ).values_list("minute", "mem_used_max", "util_mean"):
        own_minutes[minute] = max(own_minutes.get(minute, 0), mib)
        if busy is not None:
            own_busy.setdefault(minute, []).append(busy)
    per_minute.update(own_busy)  # the job's own activity wins over the GPU's where the node read it
    out.series = [
        {
            "t": m.isoformat(),
            "util": round(sum(per_minute[m]) / len(per_minute[m]), 1) if per_minute.get(m) else None,
            "mem": own_minutes.get(m),
        }
        for m in sorted(per_minute.keys() | own_minutes.keys())
    ]
    utils = [u for us in per_minute.values() for u in us]
    util_mean = sum(utils) / len(utils) if utils else None
    own = job_memory(job, gpu_uuids={p.parent.uuid for p in parts if p.parent is not None})
    out.gpu_memory_peak_mib = own.peak_mib
    out.gpu_utilization_mean = round(util_mean, 1) if util_mean is not None else None
    # A job on several shares of one GPU (half of a GPU split in four) was given their memory together.
    given: dict[int | None, int] = {}
    for p in parts:
        given[p.parent_id] = given.get(p.parent_id, 0) + p.memory_mib
    out.gpu_memory_total_mib = max(given.values())
    out.part = _part_name(parts[0])
    return [advice.GpuUse(util_mean=util_mean, mem_peak_mib=own.peak_mib, mem_total_mib=out.gpu_memory_total_mib)]


def _part_name(part: Gpu) -> str:
    if part.kind == DeviceKind.MIG:
        return f"{part.mig_profile} instance" if part.mig_profile else "MIG instance"
    return "GPU share"


def rows_seen(uses: list[advice.GpuUse]) -> bool:
    return any(u.mem_peak_mib is not None or u.util_mean is not None for u in uses)


def advisor_result(lines: Iterable[str]) -> dict[str, Any] | None:
    """The batch-size advisor's result (workers/probes/advisor.py), from its `ADVISOR_RESULT <json>` log line (the
    newest one), or None. Only the fields the page plots are kept, checked for type."""
    for line in lines:
        if not line.startswith(RESULT_PREFIX):
            continue
        try:
            body = json.loads(line[len(RESULT_PREFIX) :])
            runs = [
                {
                    "precision": str(r["precision"]),
                    "batch_size": int(r["batch_size"]),
                    "ok": bool(r["ok"]),
                    "samples_per_s": float(r["samples_per_s"]) if r.get("samples_per_s") is not None else None,
                    "peak_mib": float(r["peak_mib"]) if r.get("peak_mib") is not None else None,
                }
                for r in body["runs"]
            ]
            best = body.get("best")
            return {
                "device": str(body.get("device", "")),
                "amp_dtype": str(body.get("amp_dtype", "")),
                "limit_mib": body.get("limit_mib"),
                "margin": float(body.get("margin", 0)),
                "measured_memory": bool(body.get("measured_memory")),
                "runs": runs,
                "best": {k: best[k] for k in ("precision", "batch_size", "samples_per_s", "peak_mib")}
                if best
                else None,
            }
        except (ValueError, KeyError, TypeError):
            return None
    return None
