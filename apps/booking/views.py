"""Booking pages: the Book page (timeline, form, my reservations), a reservation's page, and the secret iCal feed."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import get_conditional_response
from django.utils.http import http_date
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.selectors import memberships_of
from apps.accounts.types import User, signed_in
from apps.booking import ical, selectors, services
from apps.booking.models import Reservation, ReservationStatus
from apps.core.errors import ApplicationError, NotFound
from apps.fleet.models import DeviceKind, Gpu, GpuModel
from apps.telemetry.selectors import SERIES_MINUTES_UP_TO, devices_series, minutes_series


@login_required
def index(request: HttpRequest) -> HttpResponse:
    policy = selectors.booking_policy()
    models = [
        {"name": m.name, "hourly_price": str(m.hourly_price)}
        for m in GpuModel.objects.filter(gpus__isnull=False).distinct().order_by("name")
    ]
    names = [m["name"] for m in models]
    teams = []
    for m in memberships_of(user=request.user):
        # The form offers a team only the models its quota allows this month ([] allows every model), rather
        # than letting the booking be refused on submit.
        allowed = set(selectors.allowed_model_names(team_id=m.team.pk))
        offered = [n for n in names if n in allowed] if allowed else names
        teams.append({"slug": m.team.slug, "name": m.team.name, "role": m.role, "models": offered})
    config = {
        "teams": teams,
        "models": models,
        "policy": {
            "granularity_minutes": policy.granularity_minutes,
            "min_duration_minutes": policy.min_duration_minutes,
            "max_duration_hours": policy.max_duration_hours,
            "max_advance_days": policy.max_advance_days,
        },
        "user": request.user.get_username(),
        "is_admin": request.user.is_staff,
        "time_zone": settings.TIME_ZONE,
        "currency": settings.PORTAL_CURRENCY,
        "parts": selectors.bookable_parts(),
    }
    return render(request, "booking/index.html", {"nav_section": "booking", "config": config})


# Why the portal (or a pool) ended a reservation early, as the Book page says it (released_reason -> text).
ENDED_BY = {
    "idle": "Reclaimed by the portal: its GPUs were idle.",
    "unused": "Reclaimed by the portal: its GPUs were not used.",
    "empty": "Reclaimed by the portal: its GPUs were not used.",
    "layout": "Ended by the portal: the MIG layout of its GPU changed and no equal device was free.",
    "gpu_gone": "Ended by the portal: its GPU is gone from its node and no equal GPU was free.",
    "scheduler": "Refused by the pool's scheduler.",
}


def _ended_why(r: Reservation) -> str:
    if r.released_reason:
        return ENDED_BY.get(r.released_reason, f"Ended by the portal ({r.released_reason}).")
    if r.status == ReservationStatus.CANCELLED:
        return "Cancelled before its start."
    if r.status == ReservationStatus.RELEASED and r.ended_at and r.ended_at < r.booked_end:
        return "Released early."
    return ""


def _booked_estimate(r: Reservation) -> dict[str, Decimal] | None:
    """GPU-hours and cost of a booking that has not started, as its quota hold counts them (the price of its day
    of booking; the ledger bills what it holds at the prices of the hours it holds them)."""
    from apps.booking.models import QuotaHold

    if r.status != ReservationStatus.BOOKED:
        return None
    hold = QuotaHold.objects.filter(reservation=r, active=True).first()
    if hold is None:
        return None
    hours = Decimal((hold.end - hold.start).total_seconds()) / 3600
    return {"gpu_hours": hours * hold.gpus, "cost": hours * hold.hourly_rate}


@login_required
@require_GET
def detail(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """One reservation: what it holds and held, its times, what it cost so far and how busy its GPUs were, the
    jobs run in it; the booker, the team's managers and admins can cancel or release it, or move its end, here."""
    from apps.billing.models import SourceKind
    from apps.billing.selectors import source_usage, source_utilization
    from apps.jobs.selectors import jobs_visible_to

    r = selectors.reservations_visible_to(user=request.user).filter(pk=reservation_id).first()
    if r is None:
        raise Http404("No such reservation.")
    seconds, cost = source_usage(source=SourceKind.RESERVATION, source_id=r.pk)
    utilization, measured = source_utilization(source=SourceKind.RESERVATION, source_id=r.pk)
    devices = _held(r)
    now = timezone.now()
    until = min(r.ended_at or r.end, now)
    series, own, untold = _use_series(r, devices, until)
    # The chart's memory axis: its own use against its shares' memory together, a device's against its own.
    memory_scale = (
        sum(g.memory_mib or 0 for g in devices) if own else max((g.memory_mib or 0 for g in devices), default=0)
    )
    context = {
        "nav_section": "booking",
        "r": r,
        "summary": _summary(r).split(": ", 1)[1],
        "devices": [{"gpu": g, "where": _where(g)} for g in devices],
        "gpu_hours": Decimal(seconds) / 3600,
        "cost": cost,
        "utilization": None if utilization is None else utilization * 100,
        "measured": measured * 100,
        "booked": _booked_estimate(r),
        "jobs": list(jobs_visible_to(user=request.user).filter(reservation_id=r.pk).order_by("-id")[:50]),
        "ended_why": _ended_why(r),
        "can_end": r.status in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE)
        and r.end > timezone.now()
        and selectors.may_end_reservation(user=request.user, reservation=r),
        "started": r.start <= timezone.now(),
        "granularity_s": max(1, selectors.booking_policy().granularity_minutes) * 60,
        "live": r.status == ReservationStatus.ACTIVE,  # the devices' utilization now, polled by the page
        # Whether the page follows changes others make to it (reservation.js): while it may still change.
        "follow": r.status in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE),
        "series": {
            "series": series,
            "total": memory_scale or None,
            "hourly": until - r.start > SERIES_MINUTES_UP_TO,
        },
        "shares_only": bool(devices) and all(g.kind == DeviceKind.SHARE for g in devices),
        "own_use": own,
        "neighbours_untold": untold,
    }
    return render(request, "booking/detail.html", context)


@login_required
@require_POST
def end(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """Cancel (not started) or release (started) a reservation from its page; refusals as a message."""
    try:
        r = services.reservation_end(user=signed_in(request.user), reservation_id=reservation_id)
    except NotFound:
        raise Http404("No such reservation.") from None
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    else:
        done = "Cancelled" if r.status == ReservationStatus.CANCELLED else "Released"
        messages.success(request, f"{done} reservation #{r.pk}.")
    return redirect("booking:detail", reservation_id=reservation_id)


def _soft_limit_text(warning: dict[str, Any]) -> str:
    """A soft-limit warning of the quota (`budget_soft_exceeded`) in words, as the Book page says it."""
    what = "soft budget" if warning.get("code") == "budget_soft_exceeded" else str(warning.get("code", "a soft limit"))
    return f"Note: the team is now over its {what} for {warning.get('month', 'that month')}."


@login_required
@require_POST
def change_end(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """Move a reservation's end from its page (later to extend it, or earlier); refusals as a message. The field
    is a `datetime-local` value, read in the time zone the page showed it in."""
    raw = request.POST.get("end", "").strip()
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        messages.error(request, "Give the new end as a date and a time.")
        return redirect("booking:detail", reservation_id=reservation_id)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    try:
        changed = services.reservation_change_end(
            user=signed_in(request.user), reservation_id=reservation_id, end=moment
        )
    except NotFound:
        raise Http404("No such reservation.") from None
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    else:
        r = changed.reservation
        messages.success(request, f"Reservation #{r.pk} now ends at {timezone.localtime(r.end):%Y-%m-%d %H:%M}.")
        for warning in changed.warnings:
            messages.warning(request, _soft_limit_text(warning))
    return redirect("booking:detail", reservation_id=reservation_id)


@login_required
@require_POST
def calendar_regenerate(request: HttpRequest) -> HttpResponse:
    if not isinstance(request.user, User):  # login_required let only a signed-in user through
        raise PermissionDenied
    key = services.calendar_feed_regenerate(user=request.user)
    url = request.build_absolute_uri(f"/book/calendar/{key}.ics")
    return render(request, "booking/calendar.html", {"nav_section": "booking", "feed_url": url})


def _use_series(r: Reservation, devices: list[Gpu], until: datetime) -> tuple[list[dict[str, Any]], bool, bool]:
    """Its devices' use over its window, for the chart (nothing before it starts); whether it is its own: shares
    of one GPU chart what is the reservation's own there (its holder's processes and its jobs, the neighbours' work
    taken out) where the node's readings tell it, else the GPU's utilization, every holder's together; and whether
    that is because another holder's POSIX uid is not known (so whose processes are whose cannot be told)."""
    from apps.billing.selectors import reservation_part_minutes

    if not devices or r.start >= until:
        return [], False, False
    hourly = until - r.start > SERIES_MINUTES_UP_TO
    parents = {g.parent_id for g in devices}
    untold = False
    if all(g.kind == DeviceKind.SHARE for g in devices) and len(parents) == 1:
        (parent,) = parents
        (minutes,) = reservation_part_minutes([(r.pk, cast(int, parent), r.start, until)])
        if minutes:
            return minutes_series(minutes, hourly=hourly), True, False
        untold = minutes is None
    return devices_series(devices=devices, start=r.start, end=until), False, untold


def _held(r: Reservation) -> list[Gpu]:
    """The devices a reservation holds (a moved one: where it is now), else those it held."""
    allocations = list(r.allocations.all())
    return [a.gpu for a in allocations if a.active] or [a.gpu for a in allocations]


def _where(gpu: Gpu) -> str:
    """A GPU as node/index; a part as its GPU's with the part: "local/3 · 1g.10gb", "local/2 · share 1/4"."""
    if gpu.parent is None:
        return f"{gpu.node.name}/{gpu.index}"
    return f"{gpu.parent.node.name}/{gpu.parent.index} · {gpu.part_label()}"


def _summary(r: Reservation) -> str:
    """ "vision: 2 x A100-80GB", and for parts "nlp: 1 x 1g.10gb of A100-80GB", "vision: 0.25 of one A100-80GB"."""
    model = r.gpu_model.name if r.gpu_model else "GPU"
    devices = _held(r)
    if devices and all(d.kind == DeviceKind.MIG for d in devices):
        return f"{r.team.slug}: {len(devices)} x {devices[0].mig_profile} of {model}"
    if devices and all(d.kind == DeviceKind.SHARE for d in devices):
        share = sum((d.capacity for d in devices), Decimal(0))
        return f"{r.team.slug}: {share.normalize():f} of one {model}"
    return f"{r.team.slug}: {r.gpu_count} x {model}"


@require_GET
def calendar_feed(request: HttpRequest, key: str) -> HttpResponse:
    """The user's teams' reservations as text/calendar; the key in the URL is the only credential.

    Event UIDs come from PORTAL_CALENDAR_UID_DOMAIN, never the request's Host: a new host name or a proxy must not
    duplicate every event in subscribers' calendars. Calendar apps poll: ETag and Last-Modified let them ask
    conditionally and get 304."""
    user = selectors.calendar_feed_user(key=key)
    if user is None:
        raise Http404("No such calendar.")
    since = timezone.now() - timedelta(days=31)
    events = [
        ical.Event(
            uid=ical.event_uid("reservation", r.pk),
            start=r.start,
            end=r.end,
            summary=_summary(r),
            description="\n".join(
                [
                    f"Team {r.team.name}, booked by {r.user.username if r.user else '?'}",
                    "GPUs: " + ", ".join(_where(gpu) for gpu in _held(r)),
                    *([r.note] if r.note else []),
                ]
            ),
            status="CANCELLED" if r.status == ReservationStatus.CANCELLED else "CONFIRMED",
            stamp=r.changed_at or r.created_at,
        )
        for r in selectors.reservations_for_calendar(user=user, since=since)
    ]
    body = ical.render(events, name=f"{settings.PORTAL_NAME}: {user.get_username()}")
    etag = ical.etag(body)
    last_change = selectors.calendar_last_change(user=user, since=since)
    last_modified = int(last_change.timestamp()) if last_change else None
    response = get_conditional_response(request, etag=etag, last_modified=last_modified)
    if response is None:
        response = HttpResponse(body, content_type="text/calendar; charset=utf-8")
    response["ETag"] = etag
    if last_modified is not None:
        response["Last-Modified"] = http_date(last_modified)
    response["Cache-Control"] = "private, max-age=300"
    response["X-Robots-Tag"] = "noindex"
    return response
