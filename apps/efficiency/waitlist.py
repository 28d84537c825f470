"""The waitlist: a member whose booking was refused for lack of GPUs waits for that model, count and window (or for
that slice: MIG instances of a profile, a share of one GPU); GPUs and slices freed by a release, a reclaim, an
unused release or a shortened booking go to the waitlist first, oldest entry first.

Serving runs right after a reservation ends early or is shortened (booking's hooks, after its commit, send the task
at once) and on every idle scan. Each entry is taken under a row lock with SKIP LOCKED, so overlapping serves never
handle the same entry twice; the booking itself goes through `reservation_create` (its placement lock and the
exclusion constraint keep two bookings off one GPU). An entry that asked to be booked at once gets a reservation from
the current booking slot (or its own start) to its end; the others are told the GPUs are free (event
`waitlist.available`, mail and webhooks, and the live banner) and stay first in line until they book or cancel.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Membership, Role, Team
from apps.accounts.types import AnyUser, User
from apps.audit.services import audit_record
from apps.booking import hooks
from apps.booking import selectors as booking_selectors
from apps.booking.services.devices import (
    check_part_in_fleet,
    check_profile,
    free_part_count,
    parse_share,
    place_parts_locked,
    share_text,
)
from apps.booking.services.reservations import reservation_create
from apps.core.errors import ApplicationError, Conflict, Forbidden, NotFound, ValidationFailed
from apps.efficiency.models import WaitlistEntry, WaitState
from apps.events.services import publish
from apps.fleet.models import GpuModel

logger = logging.getLogger(__name__)
MAX_PER_SERVE = 200


def waitlist_join(
    *,
    user: AnyUser,
    team: Team,
    gpu_model: str,
    gpu_count: int,
    start: datetime,
    end: datetime,
    auto_book: bool = False,
    note: str = "",
    mig_profile: str | None = None,
    gpu_share: Any = None,
) -> WaitlistEntry:
    """Wait for `gpu_count` GPUs of `gpu_model` in [start, end) (audited), or for `gpu_count` of its MIG instances of
    `mig_profile`, or for `gpu_share` of one of its GPUs (checked as a booking checks them: a profile or share the
    model's GPUs do not give as laid out now is a 400, since waiting could never end). Members of the team only."""
    if not isinstance(user, User) or not Membership.objects.filter(user=user, team=team).exists():
        raise Forbidden(f"You are not a member of team {team.slug}.", code="not_a_member")
    model = GpuModel.objects.filter(name=gpu_model).first()
    if model is None:
        raise ValidationFailed(f"No GPU model {gpu_model!r}.", fields={"gpu_model": ["Unknown model."]})
    if not 1 <= gpu_count <= 64:
        raise ValidationFailed("gpu_count must be 1 to 64.", fields={"gpu_count": ["From 1 to 64."]})
    share = _check_slice(model, mig_profile, gpu_share, gpu_count)
    if timezone.is_naive(start) or timezone.is_naive(end) or end <= start:
        raise ValidationFailed("end must be after start (with offsets).", fields={"end": ["Must be after start."]})
    if end <= timezone.now():
        raise ValidationFailed("This window is over.", fields={"end": ["Must be in the future."]})
    with transaction.atomic():
        # The user's row lock makes the count and the insert one step: parallel requests cannot pass the cap.
        User.objects.select_for_update().filter(pk=user.pk).first()
        waiting = WaitlistEntry.objects.filter(
            user=user, state__in=[WaitState.WAITING, WaitState.NOTIFIED], end__gt=timezone.now()
        ).count()
        if waiting >= settings.WAITLIST_MAX_WAITING_PER_USER:
            raise Conflict(
                f"You are waiting on {waiting} waitlist entries, the most one person may: leave one you no longer "
                "need first.",
                code="too_many_waiting",
            )
        entry = WaitlistEntry.objects.create(
            team=team,
            user=user,
            gpu_model=model,
            gpu_count=gpu_count,
            mig_profile=mig_profile or "",
            gpu_share=share,
            start=start,
            end=end,
            auto_book=auto_book,
            note=note[:500],
        )
        audit_record(actor=user, action="waitlist.join", target=entry, data={"auto_book": auto_book, **_slice(entry)})
    transaction.on_commit(lambda: _nudge())
    return entry


def _check_slice(model: GpuModel, mig_profile: str | None, gpu_share: Any, gpu_count: int) -> Decimal | None:
    if mig_profile and gpu_share is not None:
        raise ValidationFailed(
            "Give mig_profile or gpu_share, not both.", fields={"gpu_share": ["Not with mig_profile."]}
        )
    share = parse_share(gpu_share) if gpu_share is not None else None
    if share is not None and gpu_count != 1:
        raise ValidationFailed(
            "A share is of one GPU: gpu_count must be 1.", fields={"gpu_count": ["1 with gpu_share."]}
        )
    if mig_profile:
        check_profile(mig_profile)
    if mig_profile or (share is not None and share < 1):
        check_part_in_fleet(mig_profile=mig_profile, gpu_share=share, models=[model.name])
    return share


def _slice(entry: WaitlistEntry) -> dict[str, Any]:
    """What the entry waits for beyond model and count, for events and the audit log."""
    if entry.mig_profile:
        return {"mig_profile": entry.mig_profile}
    if entry.gpu_share is not None:
        return {"gpu_share": share_text(entry.gpu_share)}
    return {}


def _slice_free(entry: WaitlistEntry, start: datetime, end: datetime) -> bool:
    """Whether the slice the entry waits for can be booked in [start, end) now: booking's own placement, run and
    rolled back (it takes the model's placement lock until the serve's transaction ends, as a booking would)."""
    try:
        with transaction.atomic():
            place_parts_locked(
                team=entry.team,
                user=None,
                model=entry.gpu_model,
                uuids=[],
                mig_profile=entry.mig_profile or None,
                gpu_share=entry.gpu_share,
                count=entry.gpu_count,
                start=start,
                end=end,
                explain=False,
            )
    except ApplicationError:
        return False
    return True


def waitlist_cancel(*, user: AnyUser, entry_id: int) -> WaitlistEntry:
    """Leave the waitlist: the member who joined, the team's managers and admins; 409 once it is resolved."""
    with transaction.atomic():
        entry = WaitlistEntry.objects.visible_to(user).select_for_update().filter(pk=entry_id).first()
        if entry is None:
            raise NotFound("No such waitlist entry.")
        manager = (
            isinstance(user, User)
            and Membership.objects.filter(user=user, team_id=entry.team_id, role=Role.MANAGER).exists()
        )
        if not (user.is_staff or entry.user_id == user.pk or manager):
            raise Forbidden("Only the member who joined, a team manager or an admin may cancel this entry.")
        if entry.state not in (WaitState.WAITING, WaitState.NOTIFIED):
            raise Conflict(f"This entry is already {entry.state}.", code="waitlist_resolved")
        entry.state = WaitState.CANCELLED
        entry.resolved_at = timezone.now()
        entry.save(update_fields=["state", "resolved_at"])
        audit_record(actor=user, action="waitlist.cancel", target=entry)
    return entry


def _slot_start(now: datetime) -> datetime:
    """The current booking slot's start (a booking may start there, not earlier)."""
    g = max(1, booking_selectors.booking_policy().granularity_minutes)
    local = now.astimezone(booking_selectors.local_tz())
    past = (local.hour * 60 + local.minute) % g
    return (local - timedelta(minutes=past, seconds=local.second, microseconds=local.microsecond)).astimezone(UTC)


def _serve_one(entry: WaitlistEntry, now: datetime) -> str | None:
    start = max(entry.start, _slot_start(now))
    if start >= entry.end:
        entry.state = WaitState.EXPIRED
        entry.resolved_at = now
        entry.save(update_fields=["state", "resolved_at"])
        return None
    if entry.auto_book:
        try:
            result = reservation_create(
                user=entry.user,
                team=entry.team,
                start=start,
                end=entry.end,
                gpu_model=entry.gpu_model,
                gpu_count=entry.gpu_count,
                mig_profile=entry.mig_profile or None,
                gpu_share=entry.gpu_share,
                note=f"from the waitlist (#{entry.pk})",
            )
        except ApplicationError:  # still no room (or the quota says no): stays first in line
            return None
        entry.state = WaitState.BOOKED
        entry.reservation_id = result.reservation.pk
        entry.resolved_at = now
        entry.save(update_fields=["state", "reservation_id", "resolved_at"])
        audit_record(actor=None, action="waitlist.booked", target=entry, data={"reservation": result.reservation.pk})
        return "booked"
    # From now on: the part of the current slot that is already over does not need to be free.
    if entry.mig_profile or entry.gpu_share is not None:
        if not _slice_free(entry, max(start, now), entry.end):
            return None
        free = free_part_count(
            model=entry.gpu_model,
            mig_profile=entry.mig_profile or None,
            gpu_share=entry.gpu_share,
            start=max(start, now),
            end=entry.end,
        )
    else:
        free = len(booking_selectors.free_gpus(start=max(start, now), end=entry.end, model=entry.gpu_model))
        if free < entry.gpu_count:
            return None
    entry.state = WaitState.NOTIFIED
    entry.save(update_fields=["state"])
    data: dict[str, object] = {
        "waitlist_id": entry.pk,
        "gpu_model": entry.gpu_model.name,
        "gpu_count": entry.gpu_count,
        **_slice(entry),
        "free": free,
        "start": start.isoformat(),
        "end": entry.end.isoformat(),
    }
    publish(
        "waitlist.available", team_id=entry.team_id, subject=f"waitlist/{entry.pk}", data=data, user_id=entry.user_id
    )
    audit_record(actor=None, action="waitlist.notified", target=entry, data={"free": free})
    return "notified"


def waitlist_serve(*, now: datetime | None = None) -> dict[str, list[int]]:
    """Offer free GPUs to waiting entries, oldest first. Idempotent and safe to run concurrently."""
    now = now or timezone.now()
    out: dict[str, list[int]] = {"booked": [], "notified": []}
    WaitlistEntry.objects.filter(state__in=[WaitState.WAITING, WaitState.NOTIFIED], end__lte=now).update(
        state=WaitState.EXPIRED, resolved_at=now
    )
    ids = list(
        WaitlistEntry.objects.filter(state=WaitState.WAITING)
        .order_by("created_at", "id")
        .values_list("pk", flat=True)[:MAX_PER_SERVE]
    )
    for entry_id in ids:
        with transaction.atomic():
            entry = (
                WaitlistEntry.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("gpu_model", "team", "user")
                .filter(pk=entry_id, state=WaitState.WAITING)
                .first()
            )
            if entry is None:
                continue
            outcome = _serve_one(entry, now)
            if outcome is not None:
                out[outcome].append(entry.pk)
                live = {"event": f"waitlist.{outcome}", "user_id": entry.user_id, "kind": "waitlist", "id": entry.pk,
                        "reservation_id": entry.reservation_id}  # fmt: skip
                team_id = entry.team_id
                transaction.on_commit(lambda team_id=team_id, live=live: _push(team_id, live))  # type: ignore[misc]
    return out


def _push(team_id: int, data: dict[str, Any]) -> None:
    from apps.efficiency.services import push_live

    push_live(team_id, data)


def _nudge() -> None:
    """Send the serve task now (by name: this module does not import the tasks that call it)."""
    from celery import current_app

    try:
        current_app.send_task("efficiency.waitlist_serve", queue="portal")
    except Exception:  # the broker is down: the next idle scan serves the waitlist
        logger.warning("efficiency: could not send the waitlist task", exc_info=True)


def _on_reservation_ended(event: hooks.ReservationEnded) -> None:
    if event.early:
        _nudge()


def _on_reservation_shortened(event: hooks.ReservationShortened) -> None:
    _nudge()


def connect() -> None:
    hooks.register_reservation_ended(_on_reservation_ended)
    hooks.register_reservation_shortened(_on_reservation_shortened)
