"""Rollups: closed minutes from Redis into GpuRollup, minutes into hours, and retention.

Idempotent by construction: a flush upserts the *values* computed from a minute's accumulator (never adds to a
row), and deletes the accumulator only after the transaction committed. A flush that dies half-way, runs twice or
overlaps with another writes the same rows again. No sample can land in a minute after it is flushed, because
ingest drops samples older than TELEMETRY_MAX_AGE_S and a minute is flushed only after that horizon.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, FloatField, Max, Min, Q, Sum
from django.utils import timezone

from apps.core.redis import get_redis
from apps.fleet.models import DeviceKind, Gpu
from apps.jobs.models import Job
from apps.telemetry import keys
from apps.telemetry.models import GpuHourlyRollup, GpuRollup, JobMemoryMinute, OwnerMinute

logger = logging.getLogger(__name__)

_FIELDS = ["samples", "util_min", "util_mean", "util_max", "mem_used_mean", "mem_used_max", "temp_max", "power_mean"]
_MINUTE_FIELDS = [*_FIELDS, "others_mem_max", "others_util_mean"]


def _closed_before(now: float) -> float:
    """Minutes starting before this epoch are closed: no accepted sample can still fall into them."""
    return now - 60 - settings.TELEMETRY_MAX_AGE_S - 5


def accumulator_to_rows(raw: Any) -> dict[str, dict[str, Any]]:
    """`HGETALL fleet:roll:<minute>` as {uuid: rollup figures} (pure; see keys.py for the field names)."""
    acc: dict[str, dict[str, float]] = defaultdict(dict)
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else key
        uuid, _, metric = k.rpartition("|")
        if not uuid:
            continue
        try:
            acc[uuid][metric] = float(value)
        except (TypeError, ValueError):
            continue
    out: dict[str, dict[str, Any]] = {}
    for uuid, a in acc.items():
        n = int(a.get("n", 0))
        if n <= 0:
            continue

        def mean(count: str, total: str, a: dict[str, float] = a) -> float | None:
            c = a.get(count, 0)
            return round(a.get(total, 0) / c, 3) if c else None

        def whole(name: str, a: dict[str, float] = a) -> int | None:
            return int(a[name]) if name in a else None

        out[uuid] = {
            "samples": n,
            "util_min": whole("u_lo"),
            "util_mean": mean("u_n", "u_s"),
            "util_max": whole("u_hi"),
            "mem_used_mean": mean("m_n", "m_s"),
            "mem_used_max": whole("m_hi"),
            "temp_max": whole("t_hi"),
            "power_mean": mean("p_n", "p_s"),
        }
    return out


def accumulator_job_memory(raw: Any) -> dict[tuple[int, str], tuple[int, float | None]]:
    """The jobs of `HGETALL fleet:roll:<minute>`: {(job id, GPU uuid): (the most MiB its processes held, their mean
    SM % or None)} (pure; the `<uuid>|j<job id>`, `ju_n<job id>` and `ju_s<job id>` fields)."""
    mem: dict[tuple[int, str], int] = {}
    busy: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else key
        uuid, _, metric = k.rpartition("|")
        if not uuid or metric[:1] != "j":
            continue
        name, job = (metric[:4], metric[4:]) if metric[:3] == "ju_" else ("j", metric[1:])
        if not job.isdigit():
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if name == "j":
            mem[(int(job), uuid)] = int(number)
        else:
            busy[(int(job), uuid)][name] = number
    out: dict[tuple[int, str], tuple[int, float | None]] = {}
    for ident, mib in mem.items():
        counts = busy.get(ident, {})
        n = counts.get("ju_n", 0)
        out[ident] = (mib, round(counts.get("ju_s", 0) / n, 3) if n else None)
    return out


def accumulator_owners(raw: Any) -> dict[tuple[int, str], tuple[int, float | None]]:
    """The owners of `HGETALL fleet:roll:<minute>`: {(uid, GPU uuid): (the most MiB the uid's processes of no job
    held, their mean SM % or None)} (pure; the `<uuid>|o<uid>` and `ou_s<uid>` fields)."""
    mem: dict[tuple[int, str], int] = {}
    busy: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else key
        uuid, _, metric = k.rpartition("|")
        if not uuid or metric[:1] != "o":
            continue
        name, uid = ("ou_s", metric[4:]) if metric[:4] == "ou_s" else ("o", metric[1:])
        if not uid.isdigit():
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if name == "o":
            mem[(int(uid), uuid)] = int(number)
        else:
            busy[(int(uid), uuid)][name] = number
    # The mean is over every tick that read the GPU's no-job processes' SM activity (`ju_n0`, the `"o"` list's),
    # an owner absent from a tick counting 0: so the owners' means add up to `others_util_mean`, and one owner's
    # can be taken from it (apps.telemetry.selectors.no_job_work).
    ticks = {ident: n for (job, ident), n in _job_tick_counts(raw).items() if job == keys.OTHERS_JOB_ID}
    out: dict[tuple[int, str], tuple[int, float | None]] = {}
    for ident, mib in mem.items():
        uid, uuid = ident
        n = ticks.get(uuid, 0)
        total = busy.get(ident, {}).get("ou_s")
        out[ident] = (mib, round(total / n, 3) if n and total is not None else None)
    return out


def _job_tick_counts(raw: Any) -> dict[tuple[int, str], int]:
    """{(job id, GPU uuid): ticks with its SM %} of a minute's accumulator (the `ju_n<job>` fields)."""
    out: dict[tuple[int, str], int] = {}
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else key
        uuid, _, metric = k.rpartition("|")
        if uuid and metric[:4] == "ju_n" and metric[4:].isdigit():
            try:
                out[(int(metric[4:]), uuid)] = int(float(value))
            except (TypeError, ValueError):
                continue
    return out


_INSTANCE_FIELDS = ("i_n", "i_s", "i_hi", "i_un", "i_us", "i_ulo", "i_uhi")


def accumulator_instance_rows(raw: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The MIG instances of `HGETALL fleet:roll:<minute>`: {(GPU uuid, instance uuid): rollup figures} (pure; the
    `<uuid>|i_n:<MIG uuid>`, `i_s:`, `i_hi:` fields, and `i_un:`, `i_us:`, `i_ulo:`, `i_uhi:` for the SM activity
    GPM gives on Hopper and later). Temperature and power stay None: they are the GPU's."""
    acc: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else key
        uuid, _, metric = k.rpartition("|")
        name, sep, instance = metric.partition(":")
        if not uuid or not sep or name not in _INSTANCE_FIELDS or not instance:
            continue
        try:
            acc[(uuid, instance)][name] = float(value)
        except (TypeError, ValueError):
            continue
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ident, a in acc.items():
        n = int(a.get("i_n", 0))
        if n <= 0:
            continue
        busy = int(a.get("i_un", 0))
        out[ident] = {
            "samples": n,
            "util_min": int(a["i_ulo"]) if busy and "i_ulo" in a else None,
            "util_mean": round(a.get("i_us", 0) / busy, 3) if busy else None,
            "util_max": int(a["i_uhi"]) if busy and "i_uhi" in a else None,
            "mem_used_mean": round(a.get("i_s", 0) / n, 3),
            "mem_used_max": int(a["i_hi"]) if "i_hi" in a else None,
            "temp_max": None,
            "power_mean": None,
        }
    return out


def _instance_rollups(raw: Any, start: datetime) -> list[GpuRollup]:
    """A minute's rows for MIG instances, each taken only from the GPU it is an instance of (the node that sent
    it was checked to own that GPU at ingest)."""
    readings = accumulator_instance_rows(raw)
    if not readings:
        return []
    ids = {
        (parent, uuid): pk
        for uuid, parent, pk in Gpu.devices.filter(
            kind=DeviceKind.MIG,
            uuid__in={uuid for _, uuid in readings},
            parent__uuid__in={parent for parent, _ in readings},
        ).values_list("uuid", "parent__uuid", "pk")
    }
    return [GpuRollup(gpu_id=ids[ident], minute=start, **fig) for ident, fig in readings.items() if ident in ids]


def _job_memory_rows(raw: Any, start: datetime) -> list[JobMemoryMinute]:
    """A minute's job memory rows for the jobs on a MIG instance or a share of that GPU (a whole-GPU job's
    memory is its GPU's rollup; a reading for a job that holds nothing on the GPU is not the node's to give)."""
    readings = accumulator_job_memory(raw)
    if not readings:
        return []
    parts = Job.gpus.through.objects.filter(
        job_id__in={job for job, _ in readings}, gpu__parent__uuid__in={uuid for _, uuid in readings}
    ).values_list("job_id", "gpu__parent__uuid", "gpu__parent_id")
    on_part = {(job_id, uuid): parent_id for job_id, uuid, parent_id in parts if parent_id is not None}
    return [
        JobMemoryMinute(job_id=job_id, gpu_id=on_part[(job_id, uuid)], minute=start, mem_used_max=mib, util_mean=busy)
        for (job_id, uuid), (mib, busy) in readings.items()
        if (job_id, uuid) in on_part
    ]


def _owner_rows(raw: Any, start: datetime) -> list[OwnerMinute]:
    """A minute's per-owner rows, for GPUs split in shares only: elsewhere a GPU is one holder's, and its rollup
    says what that holder did."""
    readings = accumulator_owners(raw)
    if not readings:
        return []
    shared = dict(
        Gpu.devices.filter(kind=DeviceKind.SHARE, parent__uuid__in={uuid for _, uuid in readings})
        .values_list("parent__uuid", "parent_id")
        .distinct()
    )
    return [
        OwnerMinute(gpu_id=shared[uuid], uid=uid, minute=start, mem_used_max=mib, util_mean=busy)
        for (uid, uuid), (mib, busy) in readings.items()
        if uuid in shared
    ]


def flush_rollups(*, now: float | None = None) -> int:
    """Upsert every closed minute's accumulator into GpuRollup (the GPUs and their MIG instances; its part jobs'
    memory into JobMemoryMinute; on GPUs split in shares, what each owner's processes of no job used into
    OwnerMinute); returns the number of GpuRollup rows written."""
    now = time.time() if now is None else now
    redis: Any = get_redis()
    minutes = [int(float(m)) for m in redis.zrangebyscore(keys.ROLLUP_PENDING, "-inf", _closed_before(now))]
    written = 0
    late_hours: set[datetime] = set()
    # `rollup_hours` recomputes only the current and the previous hour: minutes flushed later than that (the worker
    # or beat was down while the accumulators waited in Redis) would never reach an hourly row, and the prune would
    # delete them with nothing left in their place.
    previous_hour = _hour_floor(datetime.fromtimestamp(now, tz=UTC)) - timedelta(hours=1)
    for minute in minutes:
        key = keys.rollup_key(minute)
        raw = redis.hgetall(key)
        per_gpu = accumulator_to_rows(raw)
        ids = dict(Gpu.objects.filter(uuid__in=per_gpu).values_list("uuid", "id"))
        start = datetime.fromtimestamp(minute, tz=UTC)
        others = {u: r for (j, u), r in accumulator_job_memory(raw).items() if j == keys.OTHERS_JOB_ID}
        objs = [
            GpuRollup(
                gpu_id=ids[uuid],
                minute=start,
                others_mem_max=others[uuid][0] if uuid in others else None,
                others_util_mean=others[uuid][1] if uuid in others else None,
                **fig,
            )
            for uuid, fig in per_gpu.items()
            if uuid in ids
        ]
        objs += _instance_rollups(raw, start)
        jobs = _job_memory_rows(raw, start)
        owners = _owner_rows(raw, start)
        with transaction.atomic():
            GpuRollup.objects.bulk_create(
                objs,
                update_conflicts=True,
                unique_fields=["gpu", "minute"],
                update_fields=_MINUTE_FIELDS,
                batch_size=500,
            )
            JobMemoryMinute.objects.bulk_create(
                jobs,
                update_conflicts=True,
                unique_fields=["job", "gpu", "minute"],
                update_fields=["mem_used_max", "util_mean"],
                batch_size=500,
            )
            OwnerMinute.objects.bulk_create(
                owners,
                update_conflicts=True,
                unique_fields=["gpu", "uid", "minute"],
                update_fields=["mem_used_max", "util_mean"],
                batch_size=500,
            )
        # After commit: if we die here the next flush upserts the same values again.
        pipe = redis.pipeline(transaction=True)
        pipe.delete(key)
        pipe.zrem(keys.ROLLUP_PENDING, minute)
        pipe.execute()
        written += len(objs)
        if objs and _hour_floor(start) < previous_hour:
            late_hours.add(_hour_floor(start))
    for hour in sorted(late_hours):
        rollup_hour(hour=hour)
    if written:
        logger.info("flushed %d minute rollup row(s) from %d minute(s)", written, len(minutes))
    return written


def _hour_floor(dt: datetime) -> datetime:
    return dt.astimezone(UTC).replace(minute=0, second=0, microsecond=0)  # rows are UTC hours, whatever the zone


def rollup_hour(*, hour: datetime) -> int:
    """Recompute GpuHourlyRollup for the hour starting at `hour` from its minute rows (upsert; idempotent)."""
    start = _hour_floor(hour)
    end = start + timedelta(hours=1)
    weighted = {
        # Means over the hour weight each minute by its sample count (minutes with a null mean do not count).
        "util_w": Sum(F("util_mean") * F("samples"), output_field=FloatField()),
        "util_wn": Sum("samples", filter=Q(util_mean__isnull=False)),
        "mem_w": Sum(F("mem_used_mean") * F("samples"), output_field=FloatField()),
        "mem_wn": Sum("samples", filter=Q(mem_used_mean__isnull=False)),
        "power_w": Sum(F("power_mean") * F("samples"), output_field=FloatField()),
        "power_wn": Sum("samples", filter=Q(power_mean__isnull=False)),
    }
    rows = (
        GpuRollup.objects.filter(minute__gte=start, minute__lt=end)
        .values("gpu_id")
        .annotate(
            n=Sum("samples"),
            umin=Min("util_min"),
            umax=Max("util_max"),
            mmax=Max("mem_used_max"),
            tmax=Max("temp_max"),
            **weighted,
        )
    )

    def ratio(num: Any, den: Any) -> float | None:
        return round(float(num) / float(den), 3) if num is not None and den else None

    objs = [
        GpuHourlyRollup(
            gpu_id=r["gpu_id"],
            hour=start,
            samples=int(r["n"] or 0),
            util_min=r["umin"],
            util_mean=ratio(r["util_w"], r["util_wn"]),
            util_max=r["umax"],
            mem_used_mean=ratio(r["mem_w"], r["mem_wn"]),
            mem_used_max=r["mmax"],
            temp_max=r["tmax"],
            power_mean=ratio(r["power_w"], r["power_wn"]),
        )
        for r in rows
    ]
    with transaction.atomic():
        GpuHourlyRollup.objects.bulk_create(
            objs, update_conflicts=True, unique_fields=["gpu", "hour"], update_fields=_FIELDS, batch_size=500
        )
    return len(objs)


def rollup_hours(*, now: datetime | None = None) -> int:
    """Recompute the current and the previous hour (a late flush may still add minutes to the previous one), then
    prune rows past their retention."""
    now = now or timezone.now()
    written = rollup_hour(hour=now - timedelta(hours=1)) + rollup_hour(hour=now)
    prune(now=now)
    return written


def prune(*, now: datetime | None = None) -> tuple[int, int]:
    now = now or timezone.now()
    horizon = now - timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    minutes, _ = GpuRollup.objects.filter(minute__lt=horizon).delete()
    JobMemoryMinute.objects.filter(minute__lt=horizon).delete()
    OwnerMinute.objects.filter(minute__lt=horizon).delete()
    hours, _ = GpuHourlyRollup.objects.filter(
        hour__lt=now - timedelta(days=settings.TELEMETRY_HOURLY_RETENTION_DAYS)
    ).delete()
    return minutes, hours
