"""Allocations: the GPU occupancy table that reservations and jobs write and billing reads.

Writes check for clashes under the GPUs' advisory locks (`locks.lock_gpus`); the exclusion constraint
`booking_allocation_no_overlap` (migration 0002) is the last guard against a writer without them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.booking.models import Allocation, AllocationKind, Reservation
from apps.booking.services.conflicts import clashes, held_conflict, is_exclusion_violation
from apps.booking.services.locks import lock_gpus
from apps.core.errors import ValidationFailed
from apps.fleet.models import Gpu


def allocation_rows(
    *,
    gpu_ids: Iterable[int],
    team_id: int,
    user: AnyUser | None,
    start: datetime,
    end: datetime,
    kind: str,
    reservation_id: int | None = None,
    job_id: int | None = None,
) -> list[Allocation]:
    """The unsaved rows holding each GPU over [start, end): what every writer of allocations inserts."""
    user_id = user.pk if user is not None and user.is_authenticated else None
    return [
        Allocation(
            gpu_id=int(gpu_id),
            team_id=team_id,
            user_id=user_id,
            kind=kind,
            reservation_id=reservation_id,
            job_id=job_id,
            start=start,
            end=end,
        )
        for gpu_id in gpu_ids
    ]


def _check_window(start: datetime, end: datetime) -> None:
    if timezone.is_naive(start) or timezone.is_naive(end) or end <= start:
        raise ValidationFailed("An allocation needs aware start < end.")


def _bulk_insert(rows: list[Allocation]) -> list[Allocation]:
    try:
        return Allocation.objects.bulk_create(rows)
    except IntegrityError as exc:
        if is_exclusion_violation(exc):
            # Someone inserted without the GPU lock; the constraint held. The transaction is aborted, so the
            # clashing rows cannot be looked up here.
            raise held_conflict() from exc
        raise


def allocations_create(
    *,
    gpus: Sequence[Gpu | int],
    team: Team,
    user: AnyUser | None,
    start: datetime,
    end: datetime,
    kind: str,
    reservation: Reservation | None = None,
    job_id: int | None = None,
    savepoint: bool = True,
) -> list[Allocation]:
    """Hold each of `gpus` for `team` over [start, end): one active Allocation row per GPU.

    Runs in the caller's transaction (a savepoint inside it, so a caller may catch Conflict and go on) or its own.
    `savepoint=False`: for a caller that has its own savepoint around this call (two round trips less).
    Locks: per-GPU `pg_advisory_xact_lock` in ascending id order, held until the outer transaction ends; callers
    that also hold quota rows must have taken those first (see the package docstring). Raises `Conflict` (409)
    with `conflicts` naming the clashing slots, `ValidationFailed` for a bad window or kind.
    """
    gpu_ids = [g if isinstance(g, int) else g.pk for g in gpus]
    if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
        raise ValidationFailed("Give each GPU once, at least one.")
    _check_window(start, end)
    if kind not in AllocationKind.values or (kind == AllocationKind.RESERVATION) != (reservation is not None):
        raise ValidationFailed("kind 'reservation' needs a reservation; kind 'job' must not have one.")
    with transaction.atomic(savepoint=savepoint):
        lock_gpus(gpu_ids)
        found = clashes(gpu_ids, start, end)
        if found:
            raise held_conflict(found, team_id=team.pk, viewer=user)
        rows = allocation_rows(
            gpu_ids=gpu_ids,
            team_id=team.pk,
            user=user,
            start=start,
            end=end,
            kind=kind,
            reservation_id=reservation.pk if reservation is not None else None,
            job_id=job_id,
        )
        return _bulk_insert(rows)


@dataclass(frozen=True)
class AllocationRequest:
    """One holder's GPUs for `allocations_create_many`."""

    gpu_ids: Sequence[int]
    team: Team
    user: AnyUser | None
    start: datetime
    end: datetime
    kind: str
    job_id: int | None = None


def _held_allocations(gpu_ids: Sequence[int], *, after: datetime) -> list[tuple[int, datetime, datetime]]:
    """(gpu, start, end) of the active allocations of `gpu_ids` that end after `after`. Hand-written: the
    scheduler asks on every pass that starts jobs, and compiling the ORM query cost more than running it."""
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT gpu_id, start, "end" FROM booking_allocation WHERE active AND gpu_id = ANY(%s) AND "end" > %s',
            [list(gpu_ids), after],
        )
        return [(int(g), a, b) for g, a, b in cursor.fetchall()]


def allocations_create_many(requests: Sequence[AllocationRequest], *, savepoint: bool = True) -> list[Allocation]:
    """`allocations_create` for many holders at once (the scheduler starting a pass's jobs): one lock statement,
    one overlap query, one insert. All or nothing: Conflict (without the slots: the caller retries one by one to
    learn them) when any request overlaps an active allocation or another request. Reservations are not taken
    here (they come one at a time, with their own checks). `savepoint` as for `allocations_create`."""
    if not requests:
        return []
    wanted: list[tuple[int, datetime, datetime]] = []
    for req in requests:
        if not req.gpu_ids or len(set(req.gpu_ids)) != len(req.gpu_ids):
            raise ValidationFailed("Give each GPU once, at least one.")
        _check_window(req.start, req.end)
        if req.kind == AllocationKind.RESERVATION or req.kind not in AllocationKind.values:
            raise ValidationFailed("allocations_create_many takes job allocations only.")
        wanted.extend((int(g), req.start, req.end) for g in req.gpu_ids)
    by_gpu: dict[int, list[tuple[datetime, datetime]]] = {}
    for gpu_id, lo, hi in wanted:
        if any(lo < b and a < hi for a, b in by_gpu.get(gpu_id, ())):
            raise held_conflict()
        by_gpu.setdefault(gpu_id, []).append((lo, hi))
    with transaction.atomic(savepoint=savepoint):
        lock_gpus(by_gpu)
        earliest = min(lo for _, lo, _ in wanted)
        for gpu_id, a, b in _held_allocations(sorted(by_gpu), after=earliest):
            if any(lo < b and a < hi for lo, hi in by_gpu[gpu_id]):
                raise held_conflict()
        rows = [
            row
            for req in requests
            for row in allocation_rows(
                gpu_ids=req.gpu_ids,
                team_id=req.team.pk,
                user=req.user,
                start=req.start,
                end=req.end,
                kind=req.kind,
                job_id=req.job_id,
            )
        ]
        return _bulk_insert(rows)


def allocations_end_of_job(*, job_id: int, at: datetime) -> int:
    """`allocation_end` for every active allocation of a job, in one conditional UPDATE and no lookup first (every
    job's end passes here; hand-written, as compiling the ORM's two UPDATEs cost more CPU than running them): rows
    not started by `at` are deactivated, running ones end at `at`, rows already over stay. Returns how many rows
    changed."""
    sql = (
        "UPDATE booking_allocation SET active = CASE WHEN start >= %s THEN false ELSE active END, "
        '"end" = CASE WHEN start < %s THEN %s ELSE "end" END, ended_at = %s '
        'WHERE kind = %s AND job_id = %s AND active AND (start >= %s OR "end" > %s)'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [at, at, at, at, AllocationKind.JOB, job_id, at, at])
        return int(cursor.rowcount)


def allocation_end(*, allocation_ids: Iterable[int], at: datetime) -> int:
    """End allocations at `at`: rows that have not started by then are deactivated (they leave the exclusion
    constraint), running rows get `end = at`; rows already over are left alone. Conditional UPDATEs, so it is
    idempotent and safe against a concurrent end. Returns how many rows changed. The GPUs are free from `at` on.
    """
    ids = list(allocation_ids)
    if not ids:
        return 0
    with transaction.atomic():
        base = Allocation.objects.filter(pk__in=ids, active=True)
        cancelled = base.filter(start__gte=at).update(active=False, ended_at=at)
        cut = base.filter(start__lt=at, end__gt=at).update(end=at, ended_at=at)
    return cancelled + cut
