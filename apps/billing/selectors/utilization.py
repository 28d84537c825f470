"""GPU utilization over ledger pieces: the one place billing reads telemetry's rollups."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from apps.billing.selectors.months import ZERO
from apps.booking.models import Allocation, AllocationKind
from apps.identity.selectors import unix_uids
from apps.telemetry.models import GpuHourlyRollup, GpuRollup, JobMemoryMinute, RollupFields
from apps.telemetry.selectors import Minutes, no_job_work, other_holders_uids


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _floor_hour(moment: datetime) -> datetime:
    # Hourly rollups are UTC hours; a piece split at local midnight in India starts at :30 UTC.
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _rollup_means(
    model: type[RollupFields], time_field: str, segments: Sequence[tuple[int, int, datetime, datetime]]
) -> dict[int, Decimal]:
    """{segment index: sample-weighted mean util (0..1)} of the rollups of `model` whose bucket (`time_field`)
    starts inside each (index, gpu id, lo, hi). One query; per segment one index range scan on the rollups'
    (gpu, time) unique index."""
    quote = connection.ops.quote_name
    columns = {f.name: f.column for f in model._meta.concrete_fields if f.column}
    table = quote(model._meta.db_table)
    gpu, at, util, samples = (quote(columns[name]) for name in ("gpu", time_field, "util_mean", "samples"))
    # A lateral subquery per segment: a plain join over the segments would let PostgreSQL hash the whole rollup
    # table instead (bench/billing_report.py).
    sql = (
        "SELECT seg.i, agg.w, agg.n "  # noqa: S608 - names from the model's _meta
        "FROM unnest(%s::int[], %s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS seg(i, gpu_id, lo, hi) "
        f"CROSS JOIN LATERAL (SELECT SUM(r.{util} * r.{samples}) AS w, SUM(r.{samples}) AS n FROM {table} r "
        f"WHERE r.{gpu} = seg.gpu_id AND r.{at} >= seg.lo AND r.{at} < seg.hi "
        f"AND r.{util} IS NOT NULL AND r.{samples} > 0) agg"
    )
    arrays: list[list[Any]] = [[], [], [], []]
    for segment in segments:
        for array, value in zip(arrays, segment, strict=True):
            array.append(value)
    out: dict[int, Decimal] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, arrays)
        for index, weighted, count in cursor.fetchall():
            if count and weighted is not None:
                mean = Decimal(str(float(weighted) / float(count))) / 100
                out[int(index)] = min(max(mean, ZERO), Decimal(1)).quantize(Decimal("0.000001"))
    return out


def mean_utilizations(segments: Sequence[tuple[int, datetime, datetime]]) -> list[Decimal | None]:
    """Mean utilization (0..1) of each (gpu id, start, end) from telemetry's rollups, weighted by sample count:
    the per-minute rollups whose minute starts in the segment, else (minute rows are kept only days) the hourly
    ones. None where the GPU reported nothing: the row's idle cost is then unknown, and reports say so."""
    if not segments:
        return []
    by_minute = _rollup_means(
        GpuRollup, "minute", [(i, gpu, _floor_minute(lo), hi) for i, (gpu, lo, hi) in enumerate(segments)]
    )
    missing = [(i, gpu, _floor_hour(lo), hi) for i, (gpu, lo, hi) in enumerate(segments) if i not in by_minute]
    by_hour = _rollup_means(GpuHourlyRollup, "hour", missing) if missing else {}
    return [by_minute.get(i, by_hour.get(i)) for i in range(len(segments))]


def job_part_utilizations(segments: Sequence[tuple[int, int, datetime, datetime]]) -> list[Decimal | None]:
    """Mean SM activity (0..1) of each (job id, physical GPU id, start, end) of a job on a MIG instance or share,
    from what its node attributed to the job itself (`JobMemoryMinute.util_mean`, the minutes starting in the
    segment); None where the node gave none. One query."""
    if not segments:
        return []
    quote = connection.ops.quote_name
    columns = {f.name: f.column for f in JobMemoryMinute._meta.concrete_fields if f.column}
    table = quote(JobMemoryMinute._meta.db_table)
    job, gpu, at, util = (quote(columns[name]) for name in ("job", "gpu", "minute", "util_mean"))
    sql = (
        "SELECT seg.i, agg.m "  # noqa: S608 - names from the model's _meta
        "FROM unnest(%s::int[], %s::bigint[], %s::bigint[], %s::timestamptz[], %s::timestamptz[]) "
        "AS seg(i, job_id, gpu_id, lo, hi) "
        f"CROSS JOIN LATERAL (SELECT AVG(r.{util}) AS m FROM {table} r WHERE r.{job} = seg.job_id "
        f"AND r.{gpu} = seg.gpu_id AND r.{at} >= seg.lo AND r.{at} < seg.hi AND r.{util} IS NOT NULL) agg"
    )
    arrays: list[list[Any]] = [[], [], [], [], []]
    for index, (job_id, gpu_id, lo, hi) in enumerate(segments):
        for array, value in zip(arrays, (index, job_id, gpu_id, _floor_minute(lo), hi), strict=True):
            array.append(value)
    out: list[Decimal | None] = [None] * len(segments)
    with connection.cursor() as cursor:
        cursor.execute(sql, arrays)
        for index, mean in cursor.fetchall():
            if mean is not None:
                value = Decimal(str(float(mean))) / 100
                out[int(index)] = min(max(value, ZERO), Decimal(1)).quantize(Decimal("0.000001"))
    return out


def reservation_part_minutes(
    segments: Sequence[tuple[int, int, datetime, datetime]],
) -> list[Minutes | None]:
    """{minute: (SM %, MiB)} of each (reservation id, physical GPU id, start, end) of a reservation of shares: what
    is its own on the GPU. That is what the processes of no job did there (`GpuRollup.others_*`, read where the
    node's listing shows everything on it), less what the processes of the other reservations' holders of that GPU
    during the segment did by their uids (apps.telemetry.selectors.no_job_work), plus the reservation's own jobs
    (`JobMemoryMinute`), over the minutes with that reading. None where another holder's uid is unknown: then
    whose processes are whose cannot be told (apps/efficiency/selectors.py judges idleness the same way); an empty
    dict where the node gave no reading (or its minutes are pruned). Four queries."""
    if not segments:
        return []
    parents = {gpu for _, gpu, _, _ in segments}
    lo_all, hi_all = min(lo for *_, lo, _ in segments), max(hi for *_, hi in segments)
    holds = list(
        Allocation.objects.filter(
            kind=AllocationKind.RESERVATION,
            active=True,  # an inactive row was cancelled before it started: it never held the share
            gpu__parent_id__in=parents,
            start__lt=hi_all,
            end__gt=lo_all,
        ).values_list("reservation_id", "gpu__parent_id", "start", "end", "reservation__user_id")
    )
    user_of = {rid: user for rid, _, _, _, user in holds}
    uids = unix_uids({user for *_, user in holds if user is not None})
    groups: list[frozenset[int] | None] = []
    for rid, gpu, lo, hi in segments:
        others = {r: user for r, p, start, end, user in holds if r != rid and p == gpu and start < hi and end > lo}
        groups.append(other_holders_uids(user_of.get(rid), others.values(), uids))
    known = {(gpu, group) for (_, gpu, _, _), group in zip(segments, groups, strict=True) if group is not None}
    work = no_job_work(known, since=_floor_minute(lo_all), until=hi_all)
    inner: dict[tuple[int, int, datetime], tuple[float, int]] = {}
    for rid, gpu, minute, util, mem in JobMemoryMinute.objects.filter(
        job__reservation_id__in={rid for rid, *_ in segments},
        gpu_id__in=parents,
        minute__gte=_floor_minute(lo_all),
        minute__lt=hi_all,
    ).values_list("job__reservation_id", "gpu_id", "minute", "util_mean", "mem_used_max"):
        u, m = inner.get((rid, gpu, minute), (0.0, 0))
        inner[(rid, gpu, minute)] = (u + (util or 0.0), m + mem)
    out: list[Minutes | None] = []
    for (rid, gpu, lo, hi), group in zip(segments, groups, strict=True):
        if group is None:
            out.append(None)
            continue
        lo_minute = _floor_minute(lo)
        mine: Minutes = {}
        for minute, (util, mem) in sorted(work.get((gpu, group), {}).items()):
            if not lo_minute <= minute < hi:
                continue
            ju, jm = inner.get((rid, gpu, minute), (0.0, 0))
            mine[minute] = (
                None if util is None else min(100.0, util + ju),
                None if mem is None else mem + jm,
            )
        out.append(mine)
    return out


def reservation_part_utilizations(
    segments: Sequence[tuple[int, int, datetime, datetime]],
) -> list[Decimal | None]:
    """Mean SM activity (0..1) of each (reservation id, physical GPU id, start, end) of a reservation of shares,
    over the minutes of its own use (`reservation_part_minutes`) with a reading. None where there is none, or
    where whose processes are whose cannot be told."""
    out: list[Decimal | None] = []
    for minutes in reservation_part_minutes(segments):
        values = [util for util, _ in (minutes or {}).values() if util is not None]
        if not values:
            out.append(None)
            continue
        mean = Decimal(str(sum(values) / len(values))) / 100
        out.append(min(max(mean, ZERO), Decimal(1)).quantize(Decimal("0.000001")))
    return out
