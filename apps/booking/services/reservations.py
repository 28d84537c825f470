"""Reservations: booking GPUs for a team, ending a reservation early, and the lifecycle that activates and
releases them on time. Status moves go through `_transition`, one conditional UPDATE that refuses illegal moves."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import team_ids_of
from apps.accounts.types import AnyUser, User
from apps.audit.services import audit_event, audit_record
from apps.booking import quota as quota_math
from apps.booking import selectors
from apps.booking.models import AllocationKind, BookingPolicy, Reservation, ReservationStatus
from apps.booking.services.agents import emit_ended, send_holds
from apps.booking.services.allocations import allocation_end, allocation_rows
from apps.booking.services.booking_write import BookingRows, booking_write
from apps.booking.services.conflicts import clashes, held_conflict, is_exclusion_violation, iso, refused_conflict
from apps.booking.services.devices import (
    check_part_in_fleet,
    check_profile,
    parse_memory,
    parse_share,
    place_parts_locked,
    whole_gpus,
)
from apps.booking.services.events import publish_reservation
from apps.booking.services.gpus import GpuInfo, check_named_exist, place_locked, precheck, resolve_gpus, resolve_model
from apps.booking.services.locks import lock_model
from apps.booking.services.quotas import (
    hold_row,
    lock_usage,
    models_allowed,
    quota_hold_release,
    quota_hold_update,
    quota_verdicts,
)
from apps.core.errors import Conflict, Forbidden, NotFound, ValidationFailed
from apps.fleet.models import DeviceKind, Gpu, GpuModel

PLACEMENT_ATTEMPTS = 3

_TRANSITIONS: dict[str, set[str]] = {
    ReservationStatus.BOOKED: {ReservationStatus.ACTIVE, ReservationStatus.CANCELLED, ReservationStatus.RELEASED},
    ReservationStatus.ACTIVE: {ReservationStatus.RELEASED},
    ReservationStatus.RELEASED: set(),
    ReservationStatus.CANCELLED: set(),
}


def _transition(reservation_id: int, to: str, **changes: Any) -> bool:
    """Move a reservation to status `to` with a conditional UPDATE from the statuses that may move there.
    False when it was not in one of them (already moved by someone else, or an illegal move)."""
    sources = [s for s, targets in _TRANSITIONS.items() if to in targets]
    return bool(Reservation.objects.filter(pk=reservation_id, status__in=sources).update(status=to, **changes))


def _signed_in(user: AnyUser | None) -> User | None:
    return user if isinstance(user, User) and user.is_authenticated else None


@dataclass(frozen=True)
class BookingResult:
    """A new reservation, the GPUs it holds and the soft-limit warnings to show with it."""

    reservation: Reservation
    warnings: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)


def aligned(moment: datetime, minutes: int) -> bool:
    local = moment.astimezone(selectors.local_tz())
    return local.second == 0 and local.microsecond == 0 and (local.hour * 60 + local.minute) % minutes == 0


def _floor(moment: datetime, minutes: int) -> datetime:
    local = moment.astimezone(selectors.local_tz())
    past = (local.hour * 60 + local.minute) % minutes
    return (local - timedelta(minutes=past, seconds=local.second, microseconds=local.microsecond)).astimezone(UTC)


def check_window(*, start: datetime, end: datetime, policy: BookingPolicy, now: datetime) -> None:
    """Refuse (400) a window the policy does not allow: not aware, empty, in the past, misaligned, too short,
    too long, too far ahead."""
    fields: dict[str, list[str]] = {}
    if timezone.is_naive(start) or timezone.is_naive(end):
        raise ValidationFailed("Times need a UTC offset.", fields={"start": ["Give an offset, e.g. +00:00."]})
    if end <= start:
        raise ValidationFailed("end must be after start.", fields={"end": ["Must be after start."]})
    g = max(1, policy.granularity_minutes)
    if start < _floor(now, g):
        fields["start"] = ["Must not be in the past."]
    for name, value in (("start", start), ("end", end)):
        if not aligned(value, g):
            fields.setdefault(name, []).append(f"Must align to {g} minutes.")
    duration = end.astimezone(UTC) - start.astimezone(UTC)  # real time, not wall-clock time, across DST
    if duration < timedelta(minutes=policy.min_duration_minutes):
        fields.setdefault("end", []).append(f"A booking lasts at least {policy.min_duration_minutes} minutes.")
    if duration > timedelta(hours=policy.max_duration_hours):
        fields.setdefault("end", []).append(f"A booking lasts at most {policy.max_duration_hours} hours.")
    if start > now + timedelta(days=policy.max_advance_days):
        fields.setdefault("start", []).append(f"Book at most {policy.max_advance_days} days ahead.")
    if fields:
        detail = "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
        raise ValidationFailed(f"This time window is not allowed ({detail}).", fields=fields)


def _check_member(user: AnyUser, team: Team) -> None:
    if user.is_staff:
        return
    # `is_member`: annotated by selectors.team_for_booking, which saves the membership query.
    member = getattr(team, "is_member", None)
    if member is None:
        member = team.pk in team_ids_of(user)
    if not member:
        raise Forbidden(f"You are not a member of team {team.slug}.", code="not_a_member")


def _book(
    *,
    team: Team,
    user: AnyUser,
    model_id: int | None,
    model_ids: Collection[int],
    chosen: Sequence[GpuInfo],
    start: datetime,
    end: datetime,
    status: str,
    note: str,
    activated_at: datetime | None,
) -> tuple[Reservation, list[dict[str, Any]]]:
    """The write of `reservation_create`, inside its transaction: lock the quota rows and the GPUs, check, then
    write everything in one statement (`booking_write`)."""
    rate = sum((g.hourly_price for g in chosen), Decimal("0"))
    # GPUs as the booking shows them: the shares of one GPU are one GPU (its allocations are one per share, the
    # rate their sum); a MIG instance is one.
    devices = len({g.parent_id if g.kind == "share" else g.id for g in chosen})
    # GPUs as the quota counts them: each device its fraction of a GPU (a whole GPU 1, a quarter 0.25, a 1g MIG
    # instance 1/7), as billing charges them.
    gpus = quota_math.held_gpus(sum((g.share for g in chosen), Decimal("0")))
    amounts = quota_math.hold_amounts(start=start, end=end, gpu_count=gpus, hourly_rate=rate, tz=selectors.local_tz())
    gpu_ids = [g.id for g in chosen]
    # The quota rows, then the GPUs (the package's lock order), in one round trip; a refusal below rolls both back.
    locked = lock_usage(team.pk, list(amounts), gpu_ids, reserve_reservation_id=True)
    models_allowed(team=team, limits=locked.limits, model_ids=model_ids)
    warnings = quota_verdicts(
        team=team,
        limits=locked.limits,
        used={m: u.used for m, u in locked.usage.items()},
        amounts=amounts,
        start=start,
        end=end,
        gpus=gpus,
    )
    assert locked.reservation_id is not None
    booker = _signed_in(user)
    reservation = Reservation(
        pk=locked.reservation_id,
        team=team,
        user=booker,
        gpu_model_id=model_id,
        gpu_count=devices,
        start=start,
        end=end,
        booked_end=end,
        status=status,
        note=note,
        activated_at=activated_at,
    )
    rows = BookingRows(
        reservation=reservation,
        allocations=allocation_rows(
            gpu_ids=gpu_ids,
            team_id=team.pk,
            user=booker,
            start=start,
            end=end,
            kind=AllocationKind.RESERVATION,
            reservation_id=reservation.pk,
        ),
        hold=hold_row(
            team_id=team.pk,
            kind=AllocationKind.RESERVATION,
            reservation_id=reservation.pk,
            gpu_count=devices,
            gpus=gpus,
            hourly_rate=rate,
            start=start,
            end=end,
        ),
        extra=[
            audit_event(
                actor=user,
                action="reservation.create",
                target=reservation,
                data={"gpus": [g.uuid for g in chosen], "start": iso(start), "end": iso(end), "status": status},
            )
        ],
    )
    try:
        written = booking_write(rows, usage=locked.usage, amounts=amounts)
    except IntegrityError as exc:
        if is_exclusion_violation(exc):
            raise held_conflict() from exc
        raise
    if not written:
        raise refused_conflict(clashes(gpu_ids, start, end), team_id=team.pk, viewer=user)
    return reservation, warnings


def reservation_create(
    *,
    user: AnyUser,
    team: Team,
    start: datetime,
    end: datetime,
    gpu_count: int | None = None,
    gpu_model: str | GpuModel | None = None,
    gpus: Sequence[str | Gpu] | None = None,
    note: str = "",
    include_offline: bool = False,
    mig_profile: str | None = None,
    gpu_share: Decimal | float | str | None = None,
    mig_memory_mib: int | None = None,
) -> BookingResult:
    """Book `gpu_count` GPUs of `gpu_model` (placed: one node where possible, best fit) or exactly `gpus`
    (uuids) for `team` over [start, end).

    Checks, before anything is written: membership (403), the policy's window rules (400), the GPUs or model
    (404 unknown GPU, 400 offline/unknown model/count), maintenance and clashes (409). Then in one transaction:
    the quota rows and GPUs locked, the quota's allowed models (403) and limits (403 `quota_exceeded`) checked,
    and the reservation, its allocations, its quota hold and the audit entry written (409 `conflict` when a GPU
    was taken meanwhile). A placed booking that loses its GPUs to a concurrent one is placed again (a few times)
    before 409. A booking starting now is active at once and its node agents are told after commit.
    `include_offline` (not exposed over the API): also book GPUs that are merely offline, e.g. demo data loaded
    before the node agent connects.
    `mig_profile` (with `gpu_count` instances) or `gpu_share` (a fraction of one shared GPU) book parts of GPUs
    instead (services.devices), optionally of `gpu_model` or of the GPUs or instances named in `gpus`; 400 for a
    profile or share that does not exist, 409 when nothing fitting is free. `mig_memory_mib` instead of a profile:
    instances of the smallest profile with at least that much memory that has `gpu_count` free.
    """
    now = timezone.now()
    policy = selectors.booking_policy()
    _check_member(user, team)
    check_window(start=start, end=end, policy=policy, now=now)
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    # A booking of the current slot holds from now: the past part of the slot may still be held by a reservation
    # released a moment ago (its end was cut to the release time), and nobody can use the past anyway.
    start = max(start, now)
    note = (note or "").strip()
    if len(note) > 500:
        raise ValidationFailed("The note is too long.", fields={"note": ["At most 500 characters."]})

    explicit: list[GpuInfo] | None = None
    named_whole: list[GpuInfo] = []  # the GPUs named, before a split one became its shares
    model: GpuModel | None = None
    share: Decimal | None = None
    named = [g.uuid if isinstance(g, Gpu) else str(g) for g in gpus or ()]
    parts = bool(mig_profile) or gpu_share is not None or mig_memory_mib is not None
    if parts:
        if sum((bool(mig_profile), gpu_share is not None, mig_memory_mib is not None)) > 1:
            raise ValidationFailed(
                "Give one of mig_profile, mig_memory_mib and gpu_share.", fields={"gpu_share": ["Only one."]}
            )
        if mig_memory_mib is not None:
            parse_memory(mig_memory_mib)
        elif mig_profile:
            check_profile(mig_profile)
        else:
            share = parse_share(gpu_share)
            if gpu_count not in (None, 1):
                raise ValidationFailed("A share is of one GPU.", fields={"gpu_count": ["1 with gpu_share."]})
        count = gpu_count or 1
        if count <= 0:
            raise ValidationFailed("Book at least one instance.", fields={"gpu_count": ["At least 1."]})
        model = resolve_model(gpu_model) if gpu_model else None
        model_id = model.pk if model is not None else None
        model_ids: Collection[int] = {model.pk} if model is not None else set()
        if named:
            check_named_exist(named)
        if mig_memory_mib is None:  # by memory: `profiles_with_memory` says when no instance has that much
            models = [model.name] if model is not None else []
            check_part_in_fleet(mig_profile=mig_profile or None, gpu_share=share, models=models, uuids=named)
    elif gpus:
        explicit = resolve_gpus(gpus, start, end, include_offline=include_offline)
        if gpu_count is not None and gpu_count != len(explicit):
            raise ValidationFailed(
                "gpu_count does not match the GPUs named.", fields={"gpu_count": ["Equals the number of GPUs."]}
            )
        if gpu_model is not None:
            model = resolve_model(gpu_model)
            if any(g.model_id != model.pk for g in explicit):
                raise ValidationFailed("The GPUs named are not all of that model.", fields={"gpus": ["Wrong model."]})
        count = len(explicit)
        model_ids = {g.model_id for g in explicit}
        model_id = explicit[0].model_id if len(model_ids) == 1 else None
        named_whole = explicit
        explicit = whole_gpus(explicit, start, end)
        precheck(explicit, team=team, user=user)
    else:
        model = resolve_model(gpu_model)
        if gpu_count is None or gpu_count <= 0:
            raise ValidationFailed("Book at least one GPU.", fields={"gpu_count": ["At least 1."]})
        count = gpu_count
        # GPUs per node, counted by the database (a row per node, not per GPU).
        per_node = dict(
            selectors.bookable_gpus(model=model, include_offline=include_offline)
            .filter(mig_mode=False)  # booked by its instances only
            .order_by()
            .values("node_id")
            .annotate(n=Count("id"))
            .values_list("node_id", "n")
        )
        most = max(per_node.values(), default=0) if not policy.allow_multi_node else sum(per_node.values())
        if count > most:
            where = "node" if not policy.allow_multi_node else "fleet"
            raise ValidationFailed(
                f"No {where} has {count} bookable {model.name} GPUs (at most {most}).",
                fields={"gpu_count": [f"At most {most}."]},
            )
        model_id = model.pk
        model_ids = {model.pk}

    status = ReservationStatus.ACTIVE if start <= now else ReservationStatus.BOOKED
    activated_at = now if status == ReservationStatus.ACTIVE else None
    for attempt in range(PLACEMENT_ATTEMPTS):
        try:
            with transaction.atomic():
                if parts:
                    chosen = place_parts_locked(
                        team=team,
                        user=user,
                        model=model,
                        uuids=named,
                        mig_profile=mig_profile,
                        mig_memory_mib=mig_memory_mib,
                        gpu_share=share,
                        count=count,
                        start=start,
                        end=end,
                        include_offline=include_offline,
                    )
                    model_ids = {g.model_id for g in chosen}
                    model_id = next(iter(model_ids)) if len(model_ids) == 1 else None
                elif explicit is not None:
                    chosen = explicit
                    if any(g.kind == DeviceKind.SHARE for g in explicit):
                        # A split GPU named whole: its shares as they are under the model's lock, which an admin's
                        # change of the split takes too (services/layout.py).
                        for locked in sorted({g.model_id for g in named_whole}):
                            lock_model(locked)
                        chosen = whole_gpus(named_whole, start, end)
                else:
                    assert model is not None
                    chosen = place_locked(
                        model=model,
                        count=count,
                        start=start,
                        end=end,
                        policy=policy,
                        team=team,
                        user=user,
                        include_offline=include_offline,
                    )
                    if any(g.split for g in chosen):
                        chosen = whole_gpus(chosen, start, end)
                reservation, warnings = _book(
                    team=team,
                    user=user,
                    model_id=model_id,
                    model_ids=model_ids,
                    chosen=chosen,
                    start=start,
                    end=end,
                    status=status,
                    note=note,
                    activated_at=activated_at,
                )
                publish_reservation("reservation.created", reservation, status=status)
                if status == ReservationStatus.ACTIVE:
                    publish_reservation("reservation.started", reservation, status=status)
                    send_holds(reservation.pk)
            return BookingResult(reservation=reservation, warnings=warnings, gpus=list(chosen))
        except Conflict as exc:
            # Retry only a placement that lost a GPU to a booking naming it (those skip the model lock).
            if explicit is not None or "free" in exc.extra or attempt == PLACEMENT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def lock_to_change(*, user: AnyUser, reservation_id: int, now: datetime, verb: str) -> Reservation:
    """The reservation `user` is about to end or change (`verb`), its row locked (inside the caller's transaction):
    404 when the user cannot see it, 403 when they may not (only the booker, the team's managers and admins may),
    409 `reservation_ended` when it already ended."""
    reservation = Reservation.objects.visible_to(user).select_for_update().filter(pk=reservation_id).first()
    if reservation is None:
        raise NotFound("No such reservation.")
    if not selectors.may_end_reservation(user=user, reservation=reservation):
        raise Forbidden(f"Only the member who booked it, a team manager or an admin may {verb} this reservation.")
    if reservation.status not in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE) or reservation.end <= now:
        raise Conflict(f"This reservation has already ended ({reservation.status}).", code="reservation_ended")
    return reservation


def reservation_end(*, user: AnyUser, reservation_id: int) -> Reservation:
    """Cancel a reservation that has not started, or release one that has (its GPUs are free from now on: the
    allocations' end is cut to now and the unused rest of the quota hold is given back).

    404 when the user cannot see it, 403 when they may not end it (only the booker, the team's managers and
    admins may), 409 `reservation_ended` when it already ended. Locks the reservation row first."""
    now = timezone.now()
    with transaction.atomic():
        reservation = lock_to_change(user=user, reservation_id=reservation_id, now=now, verb="end")
        allocation_ids = list(reservation.allocations.filter(active=True).values_list("pk", flat=True))
        was_active = reservation.status == ReservationStatus.ACTIVE
        if reservation.start > now:
            if not _transition(reservation.pk, ReservationStatus.CANCELLED, ended_at=now):
                raise Conflict("This reservation changed meanwhile; reload it.", code="reservation_ended")
            allocation_end(allocation_ids=allocation_ids, at=now)
            quota_hold_release(reservation=reservation)
            audit_record(actor=user, action="reservation.cancel", target=reservation, data={"at": iso(now)})
            publish_reservation("reservation.released", reservation, status=ReservationStatus.CANCELLED)
        else:
            if not _transition(reservation.pk, ReservationStatus.RELEASED, ended_at=now, end=now):
                raise Conflict("This reservation changed meanwhile; reload it.", code="reservation_ended")
            allocation_end(allocation_ids=allocation_ids, at=now)
            quota_hold_update(reservation=reservation, end=now)
            audit_record(
                actor=user,
                action="reservation.release",
                target=reservation,
                data={"at": iso(now), "booked_end": iso(reservation.booked_end)},
            )
            rid = reservation.pk
            reservation.end = now
            publish_reservation("reservation.released", reservation, status=ReservationStatus.RELEASED)
            if was_active:
                send_holds(rid, until=now)
            transaction.on_commit(lambda: emit_ended(rid, early=True))
    reservation.refresh_from_db()
    return reservation


def reservation_release_by_portal(
    *,
    reservation_id: int,
    reason: str,
    data: dict[str, Any],
    now: datetime | None = None,
    cancel_unstarted: bool = False,
    message: str = "",
) -> Reservation | None:
    """Release an active reservation for the portal itself (no user: the idle detector, `reason` "idle" or
    "unused"; a layout change or a gone GPU that took its devices away, "layout" or "gpu_gone"): the same steps as a
    release by its holder, with `released_reason` set and the figures behind the decision in the audit entry. With
    `cancel_unstarted`, a reservation that has not started (still booked) is cancelled the same way. `message`,
    when given, says why in words in the event (mail and webhooks). None when there is nothing to end any more
    (ended meanwhile). Locks the reservation row first; call inside the caller's transaction."""
    said = {"message": message} if message else {}
    now = now or timezone.now()
    reservation = Reservation.objects.select_for_update().filter(pk=reservation_id).first()
    if reservation is None or reservation.end <= now:
        return None
    # BOOKED is not started even once its start has come: the tick that activates it has not run yet.
    if cancel_unstarted and reservation.status == ReservationStatus.BOOKED:
        if not _transition(reservation.pk, ReservationStatus.CANCELLED, ended_at=now, released_reason=reason):
            return None
        allocation_end(allocation_ids=reservation.allocations.filter(active=True).values_list("pk", flat=True), at=now)
        quota_hold_release(reservation=reservation)
        audit_record(actor=None, action="reservation.cancel", target=reservation, data={**data, "reason": reason})
        cancelled = ReservationStatus.CANCELLED
        publish_reservation("reservation.released", reservation, status=cancelled, reason=reason, **said)
        reservation.refresh_from_db()
        return reservation
    if reservation.status != ReservationStatus.ACTIVE:
        return None
    if not _transition(reservation.pk, ReservationStatus.RELEASED, ended_at=now, end=now, released_reason=reason):
        return None
    allocation_ids = list(reservation.allocations.filter(active=True).values_list("pk", flat=True))
    allocation_end(allocation_ids=allocation_ids, at=now)
    quota_hold_update(reservation=reservation, end=now)
    audit_record(
        actor=None,
        action="reservation.release",
        target=reservation,
        data={**data, "at": iso(now), "booked_end": iso(reservation.booked_end), "reason": reason},
    )
    reservation.end = now
    publish_reservation("reservation.released", reservation, status=ReservationStatus.RELEASED, reason=reason, **said)
    send_holds(reservation.pk, until=now)
    rid = reservation.pk
    transaction.on_commit(lambda: emit_ended(rid, early=True))
    reservation.refresh_from_db()
    return reservation


def reservations_tick(*, now: datetime | None = None, limit: int = 500) -> dict[str, list[int]]:
    """Activate reservations whose start has come and release those whose end has passed. Each move is a
    conditional UPDATE in its own transaction, so concurrent or repeated ticks do each move once; node agents
    are told about holds and the ended-hook is called after commit, only by the tick that made the move."""
    now = now or timezone.now()
    activated: list[int] = []
    released: list[int] = []
    due_start = Reservation.objects.filter(status=ReservationStatus.BOOKED, start__lte=now, end__gt=now).values_list(
        "pk", flat=True
    )[:limit]
    for rid in list(due_start):
        with transaction.atomic():
            if _transition(rid, ReservationStatus.ACTIVE, activated_at=now):
                reservation = Reservation.objects.get(pk=rid)
                audit_record(actor=None, action="reservation.activate", target=reservation)
                publish_reservation("reservation.started", reservation, status=reservation.status)
                send_holds(rid)
                activated.append(rid)
    due_end = Reservation.objects.filter(
        status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE], end__lte=now
    ).values_list("pk", flat=True)[:limit]
    for rid in list(due_end):
        with transaction.atomic():
            if _transition(rid, ReservationStatus.RELEASED, ended_at=F("end")):
                reservation = Reservation.objects.get(pk=rid)
                audit_record(actor=None, action="reservation.end", target=reservation)
                publish_reservation("reservation.ended", reservation, status=reservation.status)
                transaction.on_commit(lambda rid=rid: emit_ended(rid, early=False))  # type: ignore[misc]
                released.append(rid)
    return {"activated": activated, "released": released}
