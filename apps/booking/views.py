"""Booking pages: the Book page (timeline, form, my reservations) and the secret iCal feed."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import get_conditional_response
from django.utils.http import http_date
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.selectors import memberships_of
from apps.accounts.types import User
from apps.booking import ical, selectors, services
from apps.booking.models import ReservationStatus
from apps.fleet.models import GpuModel


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


@login_required
@require_POST
def calendar_regenerate(request: HttpRequest) -> HttpResponse:
    if not isinstance(request.user, User):  # login_required let only a signed-in user through
        raise PermissionDenied
    key = services.calendar_feed_regenerate(user=request.user)
    url = request.build_absolute_uri(f"/book/calendar/{key}.ics")
    return render(request, "booking/calendar.html", {"nav_section": "booking", "feed_url": url})


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
            summary=f"{r.team.slug}: {r.gpu_count} x {r.gpu_model.name if r.gpu_model else 'GPU'}",
            description="\n".join(
                [
                    f"Team {r.team.name}, booked by {r.user.username if r.user else '?'}",
                    "GPUs: " + ", ".join(f"{a.gpu.node.name}/{a.gpu.index}" for a in r.allocations.all()),
                    *([r.note] if r.note else []),
                ]
            ),
            status="CANCELLED" if r.status == ReservationStatus.CANCELLED else "CONFIRMED",
            stamp=r.created_at,
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
