"""Reads for efficiency: the allocations the idle detector watches and their GPUs' minute rollups."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from apps.accounts.models import Team
from apps.booking.models import Allocation, Reservation, ReservationStatus
from apps.efficiency import detector
from apps.efficiency.models import IdleExemption, IdleMark, IdlePolicy, MarkState
from apps.fleet.models import DeviceKind, Gpu
from apps.identity.selectors import unix_uids
from apps.jobs.models import Job, JobState
from apps.telemetry.models import GpuRollup, JobMemoryMinute
from apps.telemetry.selectors import no_job_work, other_holders_uids


@dataclass(frozen=True)
class Watched:
    """A reservation or a job (outside any reservation) holding GPUs now."""

    kind: str
    source_id: int
    team_id: int
    user_id: int | None
    start: datetime
    end: datetime | None
    gpu_ids: tuple[int, ...]


def thresholds_of(policy: IdlePolicy | None) -> detector.Thresholds:
    if policy is None:
        return detector.Thresholds()
    return detector.Thresholds(
        warn_after_min=policy.warn_after_min,
        reclaim_after_min=policy.reclaim_after_min,
        utilization_below_pct=policy.utilization_below_pct,
        memory_below_pct=policy.memory_below_pct,
        unused_release_after_min=policy.unused_release_after_min,
    )


def policies() -> dict[int, IdlePolicy]:
    return {p.team_id: p for p in IdlePolicy.objects.all()}


def policy_of(team: Team) -> IdlePolicy:
    """The team's policy, unsaved with the defaults when it has none."""
    return IdlePolicy.objects.filter(team=team).first() or IdlePolicy(team=team)


def applies(policy: IdlePolicy | None, kind: str) -> bool:
    if policy is None:
        return True
    return policy.enabled and f"{kind}s" in (policy.applies_to or [])


def watched(*, now: datetime) -> list[Watched]:
    """Active reservations and running jobs outside reservations (a job inside a reservation is judged with it)."""
    out: list[Watched] = []
    reservations = list(
        Reservation.objects.filter(status=ReservationStatus.ACTIVE, start__lte=now, end__gt=now).values(
            "pk", "team_id", "user_id", "start", "end"
        )
    )
    gpus_of: dict[int, list[int]] = defaultdict(list)
    for rid, gid in Allocation.objects.filter(
        reservation_id__in=[r["pk"] for r in reservations], active=True
    ).values_list("reservation_id", "gpu_id"):
        gpus_of[rid].append(gid)
    for r in reservations:
        if gpus_of[r["pk"]]:
            out.append(
                Watched(
                    "reservation",
                    r["pk"],
                    r["team_id"],
                    r["user_id"],
                    r["start"],
                    r["end"],
                    tuple(sorted(gpus_of[r["pk"]])),
                )
            )
    jobs = list(
        Job.objects.filter(state=JobState.RUNNING, reservation__isnull=True, started_at__isnull=False).values(
            "pk", "team_id", "user_id", "started_at"
        )
    )
    job_gpus: dict[int, list[int]] = defaultdict(list)
    for jid, gid in Job.gpus.through.objects.filter(job_id__in=[j["pk"] for j in jobs]).values_list("job_id", "gpu_id"):
        job_gpus[jid].append(gid)
    for j in jobs:
        if job_gpus[j["pk"]]:
            out.append(
                Watched(
                    "job",
                    j["pk"],
                    j["team_id"],
                    j["user_id"],
                    j["started_at"] or now,
                    None,
                    tuple(sorted(job_gpus[j["pk"]])),
                )
            )
    return out


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def minute_samples(
    *, gpu_ids: Iterable[int], since: datetime, until: datetime
) -> dict[int, dict[datetime, detector.Sample]]:
    """{gpu id: {minute: sample}} from the minute rollups in [since, until). A share's minutes are its GPU's, a MIG
    instance's its own readings (detector.instance_sample: SM activity where GPM gives it, else memory alone): the
    detector's docstring says why."""
    ids = list(gpu_ids)
    devices = list(Gpu.devices.filter(pk__in=ids).values_list("pk", "kind", "parent_id", "memory_mib"))
    read_from = {
        pk: (parent if kind == DeviceKind.SHARE and parent is not None else pk) for pk, kind, parent, _ in devices
    }
    instances = {pk for pk, kind, _, _ in devices if kind == DeviceKind.MIG}
    sources = set(read_from.values())
    totals = dict(Gpu.devices.filter(pk__in=sources).values_list("pk", "memory_mib"))
    by_source: dict[int, dict[datetime, detector.Sample]] = defaultdict(dict)
    rows = GpuRollup.objects.filter(gpu_id__in=sources, minute__gte=since, minute__lt=until).values_list(
        "gpu_id", "minute", "util_mean", "mem_used_max"
    )
    for gid, minute, util, mem in rows:
        total = float(totals.get(gid) or 0)
        by_source[gid][minute] = (
            detector.instance_sample(mem, total, util)
            if gid in instances
            else detector.Sample(util=util, mem_used=mem, mem_total=total)
        )
    out: dict[int, dict[datetime, detector.Sample]] = {}
    for pk, source in read_from.items():
        if source in by_source:
            out[pk] = by_source[source]
    return out


def with_share_jobs_own_minutes(
    items: Sequence[Watched], samples: dict[int, dict[datetime, detector.Sample]], *, since: datetime, until: datetime
) -> dict[int, dict[datetime, detector.Sample]]:
    """`samples` with each job on shares judged by its own minutes where its node read the job's SM activity
    (`JobMemoryMinute.util_mean`: its processes' per-process utilization), against its shares' memory: a holder
    that computes nothing is idle even while a neighbour keeps the GPU busy. A minute without that reading keeps
    the GPU's. A reservation's own minutes are `with_share_reservations_own_minutes`."""
    jobs = {it.source_id: it for it in items if it.kind == "job"}
    if not jobs:
        return samples
    shares = {
        pk: (parent, mib)
        for pk, parent, mib in Gpu.devices.filter(
            pk__in={g for it in jobs.values() for g in it.gpu_ids}, kind=DeviceKind.SHARE
        ).values_list("pk", "parent_id", "memory_mib")
    }
    if not shares:
        return samples
    rows = JobMemoryMinute.objects.filter(
        job_id__in=list(jobs), minute__gte=since, minute__lt=until, util_mean__isnull=False
    ).values_list("job_id", "gpu_id", "minute", "util_mean", "mem_used_max")
    own: dict[tuple[int, int], dict[datetime, tuple[float, int]]] = defaultdict(dict)
    for job_id, parent_id, minute, util, mem in rows:
        own[(job_id, parent_id)][minute] = (util, mem)
    out = dict(samples)
    for job_id, it in jobs.items():
        held = [(pk, *shares[pk]) for pk in it.gpu_ids if pk in shares]
        for pk, parent, _ in held:
            minutes = own.get((job_id, parent))
            if not minutes:
                continue
            total = float(sum(mib for _, p, mib in held if p == parent))
            mine = {m: detector.Sample(util=u, mem_used=mem, mem_total=total) for m, (u, mem) in minutes.items()}
            out[pk] = {**samples.get(pk, {}), **mine}
    return out


def with_share_reservations_own_minutes(
    items: Sequence[Watched],
    samples: dict[int, dict[datetime, detector.Sample]],
    *,
    since: datetime,
    until: datetime,
) -> dict[int, dict[datetime, detector.Sample]]:
    """`samples` with a reservation of shares judged by what is its own on the GPU, where that can be told: what
    the GPU's processes of no job did (the agent's `others`, read where its process listing shows everything on
    the GPU), less what the processes of the GPU's other holders (at `until`, now) did by their uids
    (apps.telemetry.selectors.no_job_work), plus the jobs it runs inside it. Its holder computing nothing is then
    idle while a neighbour keeps the GPU busy. Where another holder's uid is unknown, whose processes are whose
    cannot be told and the reservation keeps the GPU's minutes; so does a minute without the reading. Work that is
    nobody's known (another holder's in an earlier minute, a process of no holder) stays in: it can only make this
    one look busier, never idler."""
    held = {it.source_id: it for it in items if it.kind == "reservation"}
    if not held:
        return samples
    shares = {
        pk: (parent, mib)
        for pk, parent, mib in Gpu.devices.filter(
            pk__in={g for it in held.values() for g in it.gpu_ids}, kind=DeviceKind.SHARE
        ).values_list("pk", "parent_id", "memory_mib")
    }
    if not shares:
        return samples
    parents = {parent for parent, _ in shares.values()}
    holders: dict[int, dict[int, int | None]] = defaultdict(dict)  # parent: {reservation id: its user}
    for parent, rid, user in Allocation.objects.filter(
        gpu__parent_id__in=parents,
        active=True,
        reservation__status=ReservationStatus.ACTIVE,
        reservation__start__lte=until,
        reservation__end__gt=until,
    ).values_list("gpu__parent_id", "reservation_id", "reservation__user_id"):
        if parent is not None and rid is not None:
            holders[parent][rid] = user
    uids = unix_uids({user for users in holders.values() for user in users.values() if user is not None})
    wanted: list[tuple[Watched, int, frozenset[int]]] = []
    for it in held.values():
        for parent in {shares[g][0] for g in it.gpu_ids if g in shares}:
            others = [user for rid, user in holders.get(parent, {}).items() if rid != it.source_id]
            not_mine = other_holders_uids(it.user_id, others, uids)
            if not_mine is not None:
                wanted.append((it, parent, not_mine))
    if not wanted:
        return samples
    since = max(since, min(it.start for it, _, _ in wanted))
    mine_by_gpu = no_job_work({(parent, group) for _, parent, group in wanted}, since=since, until=until)
    inner: dict[tuple[int, int], dict[datetime, tuple[float, int]]] = defaultdict(dict)
    for rid, gid, minute, util, mem in JobMemoryMinute.objects.filter(
        job__reservation_id__in={it.source_id for it, _, _ in wanted}, minute__gte=since, minute__lt=until
    ).values_list("job__reservation_id", "gpu_id", "minute", "util_mean", "mem_used_max"):
        u, m = inner[(rid, gid)].get(minute, (0.0, 0))
        inner[(rid, gid)][minute] = (u + (util or 0.0), m + mem)
    out = dict(samples)
    for it, parent, group in wanted:
        mine_pks = [g for g in it.gpu_ids if g in shares and shares[g][0] == parent]
        total = float(sum(shares[g][1] for g in mine_pks))
        jobs_here = inner.get((it.source_id, parent), {})
        mine = {}
        for minute, (util, mem) in mine_by_gpu.get((parent, group), {}).items():
            if util is None or mem is None:
                continue
            ju, jm = jobs_here.get(minute, (0.0, 0))
            mine[minute] = detector.Sample(util=min(100.0, util + ju), mem_used=mem + jm, mem_total=total)
        for pk in mine_pks:
            out[pk] = {**samples.get(pk, {}), **mine}
    return out


def allocation_minutes(
    item: Watched,
    samples: dict[int, dict[datetime, detector.Sample]],
    th: detector.Thresholds,
    *,
    since: datetime,
    now: datetime,
    fresh_within: timedelta,
) -> list[detector.Minute]:
    """The allocation's minutes from `since` to its newest minute with telemetry, oldest first; empty when the
    newest is older than `fresh_within` (telemetry stopped: nothing is decided on old data)."""
    newest = max((m for gid in item.gpu_ids for m in samples.get(gid, {})), default=None)
    if newest is None or newest < now - fresh_within:
        return []
    out: list[detector.Minute] = []
    minute = _floor_minute(since)
    while minute <= newest:
        out.append(detector.combine([samples.get(g, {}).get(minute) for g in item.gpu_ids], th))
        minute += timedelta(minutes=1)
    return out


def exemptions(items: Sequence[Watched]) -> dict[tuple[str, int], int | None]:
    """{(kind, id): extra minutes or None (exempt)} for the items that have an exemption."""
    ids_by_kind: dict[str, list[int]] = defaultdict(list)
    for it in items:
        ids_by_kind[it.kind].append(it.source_id)
    out: dict[tuple[str, int], int | None] = {}
    for kind, ids in ids_by_kind.items():
        for sid, extra in IdleExemption.objects.filter(kind=kind, source_id__in=ids).values_list(
            "source_id", "extra_min"
        ):
            out[(kind, sid)] = extra
    return out


def marks(items: Sequence[Watched]) -> dict[tuple[str, int], IdleMark]:
    out: dict[tuple[str, int], IdleMark] = {}
    ids_by_kind: dict[str, list[int]] = defaultdict(list)
    for it in items:
        ids_by_kind[it.kind].append(it.source_id)
    for kind, ids in ids_by_kind.items():
        for mark in IdleMark.objects.filter(kind=kind, source_id__in=ids):
            out[(kind, mark.source_id)] = mark
    return out


def warnings_for(*, user_id: int) -> list[IdleMark]:
    """The user's open idle warnings (for the banner on every page)."""
    return list(IdleMark.objects.filter(user_id=user_id, state=MarkState.WARNED).order_by("reclaim_at")[:5])
