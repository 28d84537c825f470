"""Reads of telemetry: the latest samples (Redis, one HMGET), the raw history and the rollups (database)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.core.redis import get_redis, get_request_redis
from apps.fleet.models import DeviceKind, Gpu
from apps.telemetry import keys
from apps.telemetry.models import GpuHourlyRollup, GpuRollup, OwnerMinute

ROLLUP_FIELDS = (
    "samples",
    "util_min",
    "util_mean",
    "util_max",
    "mem_used_mean",
    "mem_used_max",
    "temp_max",
    "power_mean",
)


def latest_samples(uuids: Iterable[str]) -> dict[str, keys.LatestSample]:
    """The latest sample of each GPU that has one, in one HMGET (an empty dict when Redis is unreachable: the
    fleet is still listed, without live figures)."""
    uuids = list(uuids)
    if not uuids:
        return {}
    try:
        # The request path's client (short timeout, no retries): a hung Redis must not hold a page for 15 s.
        raw = get_request_redis().hmget(keys.LATEST, uuids)
    except Exception:
        return {}
    out: dict[str, keys.LatestSample] = {}
    for uuid, value in zip(uuids, raw, strict=True):
        sample = keys.decode_latest(value)
        if sample is not None:
            out[uuid] = sample
    return out


def all_latest_samples() -> dict[str, keys.LatestSample]:
    """Every GPU's latest sample (HGETALL), for the publisher and /metrics."""
    out: dict[str, keys.LatestSample] = {}
    for uuid, value in get_redis().hgetall(keys.LATEST).items():
        sample = keys.decode_latest(value)
        if sample is not None:
            out[uuid.decode() if isinstance(uuid, bytes) else uuid] = sample
    return out


def is_stale(sample: keys.LatestSample | None, *, now: float | None = None) -> bool:
    if sample is None:
        return True
    now = time.time() if now is None else now
    return now - float(sample.get("ts") or 0) > keys.STALE_AFTER_S


def in_use_outside(uuids: Iterable[str], *, now: float | None = None) -> dict[str, int]:
    """Of these GPUs, those whose fresh latest sample shows at least OUTSIDE_USE_MIB used, with the MiB used: in
    use outside the portal where nothing in the portal holds them (the caller knows which). Empty when Redis
    cannot answer (`latest_samples`: a hung Redis costs a scheduling pass about a second): the scheduler uses it
    as a preference, never a reason to fail."""
    now = time.time() if now is None else now
    out: dict[str, int] = {}
    for uuid, sample in latest_samples(uuids).items():
        used = sample.get("mem_used")
        if used is not None and used >= keys.OUTSIDE_USE_MIB and not is_stale(sample, now=now):
            out[uuid] = int(used)
    return out


def raw_history(uuid: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The last samples of a GPU (oldest first), from its Redis list."""
    n = limit or settings.TELEMETRY_HISTORY_SAMPLES
    try:
        raw = get_request_redis().lrange(keys.hist_key(uuid), 0, n - 1)
    except Exception:  # Redis unreachable: no live history, the rollups still answer
        return []
    return keys.decode_hist(raw)


def rollup_history(*, gpu_id: int, since: datetime, resolution: str) -> list[dict[str, Any]]:
    """Minute or hour rollups of one GPU since `since`, oldest first, as plain dicts with `t` (the period start)."""
    if resolution == "minute":
        qs = GpuRollup.objects.filter(gpu_id=gpu_id, minute__gte=since).order_by("minute")
        period = "minute"
    else:
        qs = GpuHourlyRollup.objects.filter(gpu_id=gpu_id, hour__gte=since).order_by("hour")
        period = "hour"
    return [{"t": row.pop(period), **row} for row in qs.values(period, *ROLLUP_FIELDS)]


def instance_history(*, gpu_id: int, since: datetime, resolution: str) -> list[dict[str, Any]]:
    """The memory history of a GPU's live MIG instances (NVML reads nothing else per instance), one entry per
    instance in GPU-instance order: uuid, profile, gi_id, memory_mib and its minute or hour points (`t`,
    `mem_used_mean`, `mem_used_max`), oldest first. Empty for a GPU with no instances."""
    instances = list(
        Gpu.devices.filter(parent_id=gpu_id, kind=DeviceKind.MIG, retired_at__isnull=True)
        .order_by("gi_id", "index")
        .values("pk", "uuid", "mig_profile", "gi_id", "memory_mib")
    )
    if not instances:
        return []
    model: Any = GpuRollup if resolution == "minute" else GpuHourlyRollup
    period = "minute" if resolution == "minute" else "hour"
    points: dict[int, list[dict[str, Any]]] = {i["pk"]: [] for i in instances}
    rows = (
        model.objects.filter(gpu_id__in=points, **{f"{period}__gte": since})
        .order_by(period)
        .values_list("gpu_id", period, "mem_used_mean", "mem_used_max")
    )
    for gpu, t, mean, peak in rows:
        points[gpu].append({"t": t, "mem_used_mean": mean, "mem_used_max": peak})
    return [
        {
            "uuid": i["uuid"],
            "profile": i["mig_profile"],
            "gi_id": i["gi_id"],
            "memory_mib": i["memory_mib"],
            "points": points[i["pk"]],
        }
        for i in instances
    ]


def pick_resolution(hours: int) -> str:
    """Minutes for up to two days (and within their retention), hours beyond."""
    if hours <= 48 and hours <= settings.TELEMETRY_MINUTE_RETENTION_DAYS * 24:
        return "minute"
    return "hour"


def history_window(hours: int) -> datetime:
    return timezone.now() - timedelta(hours=hours)


def stats() -> dict[str, int]:
    """The ingest counters (keys.STATS) as ints."""
    out: dict[str, int] = {}
    for k, v in get_redis().hgetall(keys.STATS).items():
        try:
            out[k.decode() if isinstance(k, bytes) else k] = int(v)
        except (TypeError, ValueError):
            continue
    return out


Minutes = dict[datetime, tuple[float | None, int | None]]


def no_job_work(
    wanted: Iterable[tuple[int, frozenset[int]]], *, since: datetime, until: datetime
) -> dict[tuple[int, frozenset[int]], Minutes]:
    """{(GPU id, uids): {minute: (SM %, MiB)}} for each wanted (GPU id, uids): what the processes of no portal job
    did on the GPU, per minute from `since` to `until` where its node's listing showed everything on it
    (GpuRollup.others_*), less what the processes of those uids did there (OwnerMinute). On a GPU split in shares,
    what is left for one holder once the work known to be the other holders' is taken out; anyone's work not known
    to be another's stays in, so the reading can only make a holder look busier, never idler. A figure the node
    did not read is None. Two queries."""
    wanted = set(wanted)
    gpus = {gpu for gpu, _ in wanted}
    totals: dict[int, Minutes] = {gpu: {} for gpu in gpus}
    if not gpus:
        return {}
    for gpu, minute, util, mem in GpuRollup.objects.filter(
        gpu_id__in=gpus, minute__gte=since, minute__lt=until, others_mem_max__isnull=False
    ).values_list("gpu_id", "minute", "others_util_mean", "others_mem_max"):
        totals[gpu][minute] = (util, mem)
    owners: dict[tuple[int, datetime], dict[int, tuple[float, int]]] = {}
    uids = {uid for _, group in wanted for uid in group}
    if uids:
        for gpu, uid, minute, util, mem in OwnerMinute.objects.filter(
            gpu_id__in={gpu for gpu, group in wanted if group}, uid__in=uids, minute__gte=since, minute__lt=until
        ).values_list("gpu_id", "uid", "minute", "util_mean", "mem_used_max"):
            owners.setdefault((gpu, minute), {})[uid] = (util or 0.0, mem)
    out: dict[tuple[int, frozenset[int]], Minutes] = {}
    for gpu, group in wanted:
        minutes: Minutes = {}
        for minute, (util, mem) in totals[gpu].items():
            theirs = [figures for uid, figures in owners.get((gpu, minute), {}).items() if uid in group]
            # Each figure is a maximum or a mean over the same ticks (rollups.accumulator_owners): the difference
            # is what the rest ran, floored at 0 where maxima of different ticks meet.
            minutes[minute] = (
                None if util is None else max(0.0, round(util - sum(u for u, _ in theirs), 3)),
                None if mem is None else max(0, mem - sum(m for _, m in theirs)),
            )
        out[(gpu, group)] = minutes
    return out


def other_holders_uids(
    own_user: int | None, other_users: Iterable[int | None], uids: Mapping[int, int]
) -> frozenset[int] | None:
    """The uids whose work on a shared GPU is not this holder's: those of the GPU's other holders (portal users,
    apps.identity.models.UnixAccount). None when one of them has no known uid: their work cannot be told from this
    holder's. The holder's own other reservations on the GPU are the same person: nothing of theirs is taken out."""
    out: set[int] = set()
    for user in other_users:
        if user is not None and user == own_user:
            continue
        if user is None or user not in uids:
            return None
        out.add(uids[user])
    return frozenset(out)


def minutes_kept_from(now: datetime | None = None) -> datetime:
    """The first hour whose minute rollups are all still kept: the prune deletes minutes older than
    TELEMETRY_MINUTE_RETENTION_DAYS, so a reader takes the hours before this one from the hourly rollups."""
    horizon = (now or timezone.now()) - timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    return horizon.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def gpu_readings(
    *, gpu_ids: list[int], start: datetime, end: datetime, now: datetime | None = None, hourly: bool = False
) -> list[tuple[int, datetime, float | None, int | None]]:
    """(gpu id, period start, mean utilization, peak memory MiB) of the GPUs over [start, end], oldest first: minute
    rollups where they are kept, hourly ones before (an hour the window only partly covers counts all of it: on a GPU
    that ran something else in that hour, its memory too). So a job's page and a past month's report keep their
    figures after the minutes are pruned. `hourly`: the hourly rows throughout (a long window's chart)."""
    split = end + timedelta(hours=1) if hourly else minutes_kept_from(now)
    start = start.astimezone(UTC)  # rollup periods are UTC hours and minutes (an hour in India starts at :30 UTC)
    rows: list[tuple[int, datetime, float | None, int | None]] = []
    if start < split:
        rows += GpuHourlyRollup.objects.filter(
            gpu_id__in=gpu_ids,
            hour__gte=start.replace(minute=0, second=0, microsecond=0),
            hour__lte=end,
            hour__lt=split,
        ).values_list("gpu_id", "hour", "util_mean", "mem_used_max")
    if end >= split:
        rows += GpuRollup.objects.filter(
            gpu_id__in=gpu_ids, minute__gte=max(start.replace(second=0, microsecond=0), split), minute__lte=end
        ).values_list("gpu_id", "minute", "util_mean", "mem_used_max")
    return sorted(rows, key=lambda r: (r[1], r[0]))


# A window longer than this is charted per hour: a week of minutes is 10,080 points per device.
SERIES_MINUTES_UP_TO = timedelta(hours=12)


def devices_series(*, devices: Sequence[Gpu], start: datetime, end: datetime) -> list[dict[str, Any]]:
    """What held devices did over [start, end], per minute (per hour over a longer window or where the minutes are
    pruned): `util`, the mean utilization of their GPUs (a part's is its GPU's: NVML has none per MIG instance or
    share), and `mem`, the most memory one device held (a MIG instance its own; none for a share, whose GPU's
    memory is its neighbours' too). Oldest first; `t` is the period's start."""
    util_ids = {d.parent_id or d.pk for d in devices}
    mem_ids = {d.pk for d in devices if d.kind != DeviceKind.SHARE}
    rows = gpu_readings(
        gpu_ids=sorted(util_ids | mem_ids), start=start, end=end, hourly=end - start > SERIES_MINUTES_UP_TO
    )
    utils: dict[datetime, list[float]] = {}
    mems: dict[datetime, list[int]] = {}
    for gpu_id, t, util, mem in rows:
        if gpu_id in util_ids and util is not None:
            utils.setdefault(t, []).append(util)
        if gpu_id in mem_ids and mem is not None:
            mems.setdefault(t, []).append(mem)
    return [
        {
            "t": t.isoformat(),
            "util": round(sum(utils[t]) / len(utils[t]), 1) if t in utils else None,
            "mem": max(mems[t]) if t in mems else None,
        }
        for t in sorted(utils.keys() | mems.keys())
    ]


def minutes_series(minutes: Minutes, *, hourly: bool) -> list[dict[str, Any]]:
    """{minute: (util, mem)} as a chart's points (`devices_series`' shape), oldest first; `hourly`: per UTC hour
    (the mean utilization and the most memory of its minutes)."""
    if not hourly:
        return [{"t": t.isoformat(), "util": u, "mem": m} for t, (u, m) in sorted(minutes.items())]
    hours: dict[datetime, list[tuple[float | None, int | None]]] = {}
    for t, reading in minutes.items():
        hours.setdefault(t.astimezone(UTC).replace(minute=0, second=0, microsecond=0), []).append(reading)
    out = []
    for hour, readings in sorted(hours.items()):
        utils = [u for u, _ in readings if u is not None]
        mems = [m for _, m in readings if m is not None]
        out.append(
            {
                "t": hour.isoformat(),
                "util": round(sum(utils) / len(utils), 1) if utils else None,
                "mem": max(mems) if mems else None,
            }
        )
    return out
