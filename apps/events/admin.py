from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from apps.events.models import MailDelivery, OutboxEvent, WebhookDelivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin[WebhookEndpoint]):
    """Endpoints are registered through the API or the Webhooks page (which shows the secret once); here admins
    look, disable or delete. The encrypted secret is never shown."""

    list_display = ["id", "url", "team", "is_active", "failing_since", "disabled_at", "created_at"]
    list_select_related = ["team"]
    list_filter = ["is_active", "team"]
    search_fields = ["url"]
    exclude = ["secret_encrypted"]
    readonly_fields = ["created_by", "created_at", "failing_since", "disabled_at"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(OutboxEvent)
class OutboxEventAdmin(admin.ModelAdmin[OutboxEvent]):
    list_display = ["id", "event_type", "subject", "team", "created_at", "dispatched_at"]
    list_select_related = ["team"]
    list_filter = ["event_type"]
    search_fields = ["subject"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin[WebhookDelivery]):
    list_display = ["id", "endpoint", "event", "status", "attempts", "response_code", "last_attempt_at"]
    list_select_related = ["endpoint", "event"]
    list_filter = ["status"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(MailDelivery)
class MailDeliveryAdmin(admin.ModelAdmin[MailDelivery]):
    list_display = ["id", "user", "event", "status", "attempts", "sent_at"]
    list_select_related = ["user", "event"]
    list_filter = ["status"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
