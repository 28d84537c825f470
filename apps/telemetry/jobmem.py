"""The GPU memory each job's own processes use, as the agents attribute it (workers/jobmem.py).

Why: on a GPU split into shares, the GPU's memory reading is what all its jobs hold together; a job's guidance
(its peak against its budget, "close to an OOM") needs the job's own number. Ingest keeps the latest reading and
the peak per (job, GPU) in Redis (`keys.JOB_MEMORY`); this module reads them, only for the job's own GPUs (so a
node cannot speak for another node's job), and copies the peaks into `Job.gpu_memory_own_peak_mib` once a minute,
where they outlive Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest

from apps.core.redis import get_redis
from apps.jobs.models import Job, JobState
from apps.telemetry import keys

# A field not reported for this long belongs to a job that ended or moved on: its peak is in the database by then.
FORGET_AFTER_S = 600.0


@dataclass(frozen=True)
class JobGpuMemory:
    """One job's reading on one GPU: when it was last reported, what it used then, and its peak."""

    job_id: int
    uuid: str
    ts: float
    used_mib: int
    peak_mib: int
    busy_pct: int | None = None  # % of SMs its processes kept busy at the last report, where the node read it

    def fresh(self, now: float) -> bool:
        return now - self.ts <= keys.JOB_MEMORY_FRESH_S


def _field(job_id: int, uuid: str) -> str:
    return f"{job_id}|{uuid}"


def _parse(field: Any, value: Any) -> JobGpuMemory | None:
    try:
        name = field.decode() if isinstance(field, bytes) else str(field)
        text = value.decode() if isinstance(value, bytes) else str(value)
        job, uuid = name.split("|", 1)
        ts, used, peak, *busy = text.split(",")
        if len(busy) > 1:
            return None
        return JobGpuMemory(int(job), uuid, float(ts), int(used), int(peak), int(busy[0]) if busy else None)
    except (ValueError, AttributeError):
        return None


def job_memory_readings(pairs: Iterable[tuple[int, str]]) -> dict[tuple[int, str], JobGpuMemory]:
    """The readings of these (job id, physical GPU uuid) pairs that exist, in one round trip."""
    wanted = list(dict.fromkeys(pairs))
    if not wanted:
        return {}
    values = get_redis().hmget(keys.JOB_MEMORY, [_field(j, u) for j, u in wanted])
    out: dict[tuple[int, str], JobGpuMemory] = {}
    for (job_id, uuid), value in zip(wanted, values, strict=True):
        reading = _parse(_field(job_id, uuid), value) if value is not None else None
        if reading is not None:
            out[(job_id, uuid)] = reading
    return out


@dataclass(frozen=True)
class OwnerReading:
    """What the processes of no job that one uid owns used on one GPU at its node's last listing that had them."""

    uid: int
    uuid: str
    ts: float
    used_mib: int
    busy_pct: int | None = None


def _parse_owner(field: Any, value: Any) -> OwnerReading | None:
    try:
        name = field.decode() if isinstance(field, bytes) else str(field)
        text = value.decode() if isinstance(value, bytes) else str(value)
        uid, uuid = name.split("|", 1)
        ts, used, *busy = text.split(",")
        if len(busy) > 1:
            return None
        return OwnerReading(int(uid), uuid, float(ts), int(used), int(busy[0]) if busy else None)
    except (ValueError, AttributeError):
        return None


def owner_readings(pairs: Iterable[tuple[int, str]]) -> dict[tuple[int, str], OwnerReading]:
    """The latest readings of these (uid, physical GPU uuid) pairs that exist, in one round trip."""
    wanted = list(dict.fromkeys(pairs))
    if not wanted:
        return {}
    values = get_redis().hmget(keys.OWNER_MEMORY, [f"{uid}|{uuid}" for uid, uuid in wanted])
    out: dict[tuple[int, str], OwnerReading] = {}
    for (uid, uuid), value in zip(wanted, values, strict=True):
        reading = _parse_owner(f"{uid}|{uuid}", value) if value is not None else None
        if reading is not None:
            out[(uid, uuid)] = reading
    return out


def running_jobs_in(reservation_ids: Iterable[int]) -> list[tuple[int, int]]:
    """(reservation id, job id) of the jobs running inside these reservations."""
    ids = list(reservation_ids)
    if not ids:
        return []
    rows = Job.objects.filter(reservation_id__in=ids, state=JobState.RUNNING).values_list("reservation_id", "id")
    return [(int(r), int(j)) for r, j in rows if r is not None]


def reservation_users(reservation_ids: Iterable[int]) -> dict[int, int]:
    """{reservation id: its user's id} (one query)."""
    from apps.booking.models import Reservation

    ids = list(reservation_ids)
    if not ids:
        return {}
    return dict(Reservation.objects.filter(pk__in=ids).values_list("pk", "user_id"))


def job_physical_uuids(job: Job) -> list[str]:
    """The uuids of the physical GPUs a job's devices are on (a MIG instance's or a share's parent)."""
    rows = Job.gpus.through.objects.filter(job_id=job.pk).values_list("gpu__uuid", "gpu__parent__uuid")
    return sorted({parent or uuid for uuid, parent in rows})


@dataclass(frozen=True)
class JobMemory:
    """A job's own GPU memory: what it uses now (None when no fresh reading) and its peak (None when never read)."""

    used_mib: int | None
    peak_mib: int | None


def job_memory(job: Job, *, gpu_uuids: Iterable[str] | None = None, now: float | None = None) -> JobMemory:
    """The job's own memory over its GPUs (`gpu_uuids`, the physical ones, when the caller has them): the largest
    fresh reading, and the larger of the stored peak and the live ones (per GPU: a multi-GPU job's memory guidance
    is per GPU)."""
    now = time.time() if now is None else now
    uuids = job_physical_uuids(job) if gpu_uuids is None else gpu_uuids
    readings = job_memory_readings((job.pk, uuid) for uuid in uuids)
    fresh = [r.used_mib for r in readings.values() if r.fresh(now)]
    peaks = [r.peak_mib for r in readings.values()]
    if job.gpu_memory_own_peak_mib is not None:
        peaks.append(job.gpu_memory_own_peak_mib)
    return JobMemory(used_mib=max(fresh) if fresh else None, peak_mib=max(peaks) if peaks else None)


def flush_job_memory(*, now: float | None = None) -> int:
    """Copy every reported peak into its job (the larger one wins), for the job's own GPUs only, and forget the
    readings not reported for FORGET_AFTER_S (what no job's processes use, `keys.OTHERS_JOB_ID`, and its owners'
    readings, `keys.OWNER_MEMORY`, only then).
    Returns the number of jobs updated."""
    now = time.time() if now is None else now
    redis: Any = get_redis()
    owners = redis.hgetall(keys.OWNER_MEMORY)
    stale = [f for f, v in owners.items() if (o := _parse_owner(f, v)) is None or now - o.ts > FORGET_AFTER_S]
    if stale:
        redis.hdel(keys.OWNER_MEMORY, *stale)
    readings = [r for f, v in redis.hgetall(keys.JOB_MEMORY).items() if (r := _parse(f, v)) is not None]
    if not readings:
        return 0
    rows = Job.gpus.through.objects.filter(job_id__in={r.job_id for r in readings}).values_list(
        "job_id", "gpu__uuid", "gpu__parent__uuid"
    )
    own = {(job_id, parent or uuid) for job_id, uuid, parent in rows}
    peaks: dict[int, int] = {}
    for r in readings:
        if (r.job_id, r.uuid) in own:
            peaks[r.job_id] = max(peaks.get(r.job_id, 0), r.peak_mib)
    # One statement per job, each its own transaction: a row lock held for one UPDATE, never across jobs, so the
    # flush cannot deadlock with a scheduler pass that locks several jobs in its own order.
    for job_id, peak in peaks.items():
        Job.objects.filter(pk=job_id).update(
            gpu_memory_own_peak_mib=Greatest(Coalesce(F("gpu_memory_own_peak_mib"), Value(0)), Value(peak))
        )
    # After the copy, so a crash in between only repeats it. A reading for a GPU that is not the job's is dropped
    # at once (a node's mistake or lie must not sit in Redis).
    gone = [
        _field(r.job_id, r.uuid)
        for r in readings
        if now - r.ts > FORGET_AFTER_S or ((r.job_id, r.uuid) not in own and r.job_id != keys.OTHERS_JOB_ID)
    ]
    if gone:
        redis.hdel(keys.JOB_MEMORY, *gone)
    return len(peaks)


def outside_owners(gpu_uuids: Iterable[str], *, now: float | None = None) -> dict[str, list[OwnerReading]]:
    """{GPU uuid: the owners whose processes (of no portal job) use memory on it, most first} for these physical
    GPUs, from their node's latest process listing: the owner readings taken with the GPU's fresh job-0 reading (an
    owner missing from that listing ran nothing then). One round trip; the owner hash is read whole (its fields are
    the (uid, GPU) pairs reported in the last FORGET_AFTER_S: a few per GPU something outside the portal uses)."""
    wanted = list(dict.fromkeys(gpu_uuids))
    if not wanted:
        return {}
    now = time.time() if now is None else now
    pipe = get_redis().pipeline(transaction=False)
    pipe.hmget(keys.JOB_MEMORY, [_field(keys.OTHERS_JOB_ID, uuid) for uuid in wanted])
    pipe.hgetall(keys.OWNER_MEMORY)
    totals_raw, owners_raw = pipe.execute()
    listed: dict[str, float] = {}
    for uuid, value in zip(wanted, totals_raw, strict=True):
        total = _parse(_field(keys.OTHERS_JOB_ID, uuid), value) if value is not None else None
        if total is not None and total.fresh(now):
            listed[uuid] = total.ts
    out: dict[str, list[OwnerReading]] = {}
    for field, value in owners_raw.items():
        reading = _parse_owner(field, value)
        if reading is not None and reading.used_mib > 0 and listed.get(reading.uuid) == reading.ts:
            out.setdefault(reading.uuid, []).append(reading)
    for readings in out.values():
        readings.sort(key=lambda r: (-r.used_mib, r.uid))
    return out
