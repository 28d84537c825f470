"""Moving a reservation's end: extending it (the GPUs must be free for the added time, and the quota must allow it)
or ending it earlier than booked (the rest of the window and its quota are given back).

Lock order, as everywhere in the package: the reservation row, then the team's quota rows and the GPUs' advisory
locks (`lock_usage`), then its quota hold. The exclusion constraint on allocations stays the last guard."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.accounts.types import AnyUser
from apps.audit.services import audit_record
from apps.booking import hooks, selectors
from apps.booking import quota as quota_math
from apps.booking.models import BookingPolicy, QuotaHold, Reservation, ReservationStatus
from apps.booking.services.agents import send_holds
from apps.booking.services.conflicts import clashes, held_conflict, is_exclusion_violation, iso, refused_conflict
from apps.booking.services.events import publish_reservation
from apps.booking.services.quotas import lock_usage, models_allowed, quota_hold_update, quota_verdicts
from apps.booking.services.reservations import aligned, lock_to_change
from apps.core.errors import ValidationFailed


def check_new_end(*, reservation: Reservation, end: datetime, policy: BookingPolicy, now: datetime) -> None:
    """Refuse (400) an end the policy does not allow for this reservation: not aware, not on the grid, not after
    now and its start, or making it shorter or longer than a booking may be."""
    if timezone.is_naive(end):
        raise ValidationFailed("Times need a UTC offset.", fields={"end": ["Give an offset, e.g. +00:00."]})
    g = max(1, policy.granularity_minutes)
    problems: list[str] = []
    if end <= now:
        problems.append("Must be in the future.")
    if not aligned(end, g):
        problems.append(f"Must align to {g} minutes.")
    duration = end.astimezone(UTC) - reservation.start.astimezone(UTC)
    if duration < timedelta(minutes=policy.min_duration_minutes):
        problems.append(f"A booking lasts at least {policy.min_duration_minutes} minutes.")
    if duration > timedelta(hours=policy.max_duration_hours):
        problems.append(f"A booking lasts at most {policy.max_duration_hours} hours.")
    if problems:
        raise ValidationFailed(f"This end is not allowed ({' '.join(problems)}).", fields={"end": problems})


def _move_allocations(reservation_id: int, *, old_end: datetime, new_end: datetime) -> list[int]:
    """Set the end of the reservation's allocations that end with it; returns their GPUs. The exclusion constraint
    refuses an extension into another holder's window (a writer without the GPU locks)."""
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE booking_allocation SET "end" = %s WHERE reservation_id = %s AND active AND "end" = %s '
            "RETURNING gpu_id",
            [new_end, reservation_id, old_end],
        )
        return sorted(int(row[0]) for row in cursor.fetchall())


@dataclass(frozen=True)
class EndChanged:
    """The reservation with its new end, and the soft limits of the team's quota the added time went over."""

    reservation: Reservation
    warnings: list[dict[str, Any]] = field(default_factory=list)


def reservation_change_end(*, user: AnyUser, reservation_id: int, end: datetime) -> EndChanged:
    """Move the end of a booked or active reservation to `end`: later (extend) or earlier, but after now.

    404 when the user cannot see it, 403 when they may not change it (the booker, the team's managers and admins
    may, as for ending it), 409 `reservation_ended` once it has ended, 400 for an end the booking policy does not
    allow. Extending: 409 `conflict` (with the clashing slots) when another booking or job holds one of its GPUs or
    devices in the added time, 403 `quota_exceeded` when the added hours or cost or the GPUs held at once would
    exceed the team's quota (the soft limits it goes over come back as warnings, as for a booking). Ending earlier
    gives the rest of the quota hold back and offers the freed time to the waitlist. The node agents are told the
    new end of an active reservation, a Slurm pool's mirrored reservation follows on the bridge's next poll, and a
    `reservation.changed` event says both ends."""
    now = timezone.now()
    policy = selectors.booking_policy()
    with transaction.atomic():
        reservation = lock_to_change(user=user, reservation_id=reservation_id, now=now, verb="change")
        check_new_end(reservation=reservation, end=end, policy=policy, now=now)
        old_end, new_end = reservation.end, end.astimezone(UTC)
        if new_end == old_end:
            return EndChanged(reservation)
        gpu_ids = list(
            reservation.allocations.filter(active=True, end=old_end).order_by("gpu_id").values_list("gpu_id", flat=True)
        )
        warnings: list[dict[str, Any]] = []
        if new_end > old_end:
            warnings = _check_extension(reservation, gpu_ids=gpu_ids, old_end=old_end, new_end=new_end, user=user)
        try:
            with transaction.atomic():
                moved = _move_allocations(reservation.pk, old_end=old_end, new_end=new_end)
        except IntegrityError as exc:
            if is_exclusion_violation(exc):
                raise held_conflict() from exc
            raise
        # Counted without a check here: an extension was checked above, under the same locks.
        quota_hold_update(reservation=reservation, end=new_end)
        Reservation.objects.filter(pk=reservation.pk).update(end=new_end, booked_end=new_end, changed_at=now)
        reservation.end = reservation.booked_end = new_end
        audit_record(
            actor=user,
            action="reservation.extend" if new_end > old_end else "reservation.shorten",
            target=reservation,
            data={"from": iso(old_end), "to": iso(new_end), "gpus": len(moved)},
        )
        publish_reservation("reservation.changed", reservation, status=reservation.status, previous_end=old_end)
        if reservation.status == ReservationStatus.ACTIVE:
            send_holds(reservation.pk)
        if new_end < old_end:
            # The waitlist may be waiting for exactly this time; it hears of it after commit, not at its next scan.
            freed = hooks.ReservationShortened(
                reservation_id=reservation.pk,
                team_id=reservation.team_id,
                gpu_ids=tuple(moved),
                freed_from=new_end,
                freed_until=old_end,
            )
            transaction.on_commit(lambda: hooks.on_reservation_shortened(freed))
    reservation.refresh_from_db()
    return EndChanged(reservation, warnings)


def _check_extension(
    reservation: Reservation, *, gpu_ids: list[int], old_end: datetime, new_end: datetime, user: AnyUser
) -> list[dict[str, Any]]:
    """The added time [old_end, new_end): its quota months and the GPUs locked, then free GPUs and the quota.
    Returns the soft-limit warnings."""
    hold = QuotaHold.objects.filter(reservation_id=reservation.pk, active=True).first()
    tz = selectors.local_tz()
    # What the booking counted per hour (its GPUs' fractions and prices); a reservation always has a hold.
    gpus = hold.gpus if hold is not None else quota_math.held_gpus(reservation.gpu_count)
    rate = hold.hourly_rate if hold is not None else Decimal(0)
    amounts = quota_math.hold_amounts(start=old_end, end=new_end, gpu_count=gpus, hourly_rate=rate, tz=tz)
    locked = lock_usage(reservation.team_id, list(amounts), gpu_ids)
    found = clashes(gpu_ids, old_end, new_end)
    if found:
        raise refused_conflict(found, team_id=reservation.team_id, viewer=user)
    team = reservation.team
    if reservation.gpu_model_id is not None:
        models_allowed(team=team, limits=locked.limits, model_ids={reservation.gpu_model_id})
    return quota_verdicts(
        team=team,
        limits=locked.limits,
        used={m: u.used for m, u in locked.usage.items()},
        amounts=amounts,
        start=old_end,
        end=new_end,
        gpus=gpus,
    )
