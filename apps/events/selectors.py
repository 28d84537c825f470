"""Read webhooks, their deliveries and mail preferences, scoped to who asks."""

from __future__ import annotations

from datetime import UTC, timedelta

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone

from apps.accounts.scoping import managed_team_ids_of
from apps.accounts.types import AnyUser, User
from apps.events.models import DeliveryStatus, MailPreference, WebhookDelivery, WebhookEndpoint


def webhooks_visible_to(*, user: AnyUser) -> QuerySet[WebhookEndpoint]:
    """Admins: every endpoint; team managers: their teams' endpoints; everyone else: none. An endpoint's URL and
    its delivery log can say a lot about a team's systems, so plain members do not see them."""
    endpoints = WebhookEndpoint.objects.visible_to(user)
    if user.is_authenticated and user.is_staff:
        return endpoints.select_related("team")
    return endpoints.filter(team_id__in=managed_team_ids_of(user)).select_related("team")


def webhook_get(*, user: AnyUser, endpoint_id: int) -> WebhookEndpoint | None:
    return webhooks_visible_to(user=user).filter(pk=endpoint_id).first()


def deliveries_of(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """The endpoint's delivery log, newest first (the endpoint was already checked visible)."""
    return (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .select_related("event", "endpoint")
        .order_by("-created_at", "-id")
    )


def mail_preference_of(*, user: User) -> MailPreference:
    """The user's mail preferences; an unsaved all-off row when they never chose."""
    return MailPreference.objects.filter(user=user).first() or MailPreference(user=user)


def delivery_hours(*, endpoint: WebhookEndpoint, hours: int = 24) -> list[dict[str, object]]:
    """Attempts of the endpoint's deliveries in each of the last `hours` hours, by outcome (for the chart)."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    since = now - timedelta(hours=hours - 1)
    rows = (
        WebhookDelivery.objects.filter(endpoint=endpoint, last_attempt_at__gte=since)
        .annotate(hour=TruncHour("last_attempt_at", tzinfo=UTC))  # the UTC hours counted below, not local ones
        .values("hour", "status")
        .annotate(n=Count("id"))
    )
    counts: dict[tuple[object, str], int] = {(r["hour"], r["status"]): r["n"] for r in rows}
    out: list[dict[str, object]] = []
    for i in range(hours):
        hour = since + timedelta(hours=i)
        ok = counts.get((hour, DeliveryStatus.SUCCEEDED), 0)
        bad = sum(counts.get((hour, s), 0) for s in (DeliveryStatus.FAILED, DeliveryStatus.ABANDONED))
        out.append({"hour": hour, "succeeded": ok, "failed": bad})
    return out
