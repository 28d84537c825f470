from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.events.models import MailPreference, WebhookDelivery, WebhookEndpoint


class WebhookInput(serializers.Serializer[dict[str, Any]]):
    team = serializers.CharField(allow_null=True, help_text="a team's slug; null (admins only): every team")
    url = serializers.URLField(max_length=500)
    events = serializers.ListField(
        child=serializers.CharField(max_length=64), min_length=1, max_length=32, help_text='e.g. ["job.*", "node.down"]'
    )


class WebhookOutput(serializers.ModelSerializer[WebhookEndpoint]):
    team = serializers.CharField(source="team.slug", read_only=True, allow_null=True, default=None)

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "team", "url", "events", "is_active", "created_at", "disabled_at", "disabled_reason"]


class WebhookCreatedOutput(WebhookOutput):
    secret = serializers.SerializerMethodField(help_text="The signing secret (whsec_...). Shown once; store it now.")

    class Meta(WebhookOutput.Meta):
        fields = [*WebhookOutput.Meta.fields, "secret"]

    def get_secret(self, obj: WebhookEndpoint) -> str:
        return str(self.context["secret"])


class DeliveryOutput(serializers.ModelSerializer[WebhookDelivery]):
    webhook_id = serializers.CharField(read_only=True)
    event_id = serializers.UUIDField(source="event.uuid", read_only=True)
    event_type = serializers.CharField(source="event.event_type", read_only=True)
    subject = serializers.CharField(source="event.subject", read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook_id",
            "event_id",
            "event_type",
            "subject",
            "status",
            "attempts",
            "response_code",
            "duration_ms",
            "error",
            "created_at",
            "last_attempt_at",
            "next_attempt_at",
            "delivered_at",
        ]


class MailPreferenceSerializer(serializers.ModelSerializer[MailPreference]):
    class Meta:
        model = MailPreference
        fields = ["job_finished", "job_failed", "reservation_starting", "idle_warnings", "budget_thresholds"]
        extra_kwargs = {name: {"required": False} for name in fields}
