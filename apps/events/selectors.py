"""Read webhooks, their deliveries and mail preferences, scoped to who asks."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.scoping import managed_team_ids_of
from apps.accounts.types import AnyUser, User
from apps.events.models import MailPreference, WebhookDelivery, WebhookEndpoint


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
