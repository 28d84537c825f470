"""The event outbox, webhook endpoints and their deliveries, mail preferences and mail deliveries."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from apps.accounts.scoping import ScopedQuerySet


class EventType(models.TextChoices):
    JOB_QUEUED = "job.queued", "Job queued"
    JOB_RUNNING = "job.running", "Job running"
    JOB_SUCCEEDED = "job.succeeded", "Job succeeded"
    JOB_FAILED = "job.failed", "Job failed"
    JOB_CANCELLED = "job.cancelled", "Job cancelled"
    JOB_LOST = "job.lost", "Job lost"
    RESERVATION_CREATED = "reservation.created", "Reservation created"
    RESERVATION_STARTING_SOON = "reservation.starting_soon", "Reservation starting soon"
    RESERVATION_STARTED = "reservation.started", "Reservation started"
    RESERVATION_MOVED = "reservation.moved", "Reservation moved to other devices"
    RESERVATION_CHANGED = "reservation.changed", "Reservation's end changed"
    RESERVATION_ENDED = "reservation.ended", "Reservation ended"
    RESERVATION_RELEASED = "reservation.released", "Reservation released"
    BUDGET_THRESHOLD = "budget.threshold", "Budget threshold crossed"
    IDLE_WARNING = "idle.warning", "Idle warning"
    IDLE_RECLAIMED = "idle.reclaimed", "Idle GPU reclaimed"
    NODE_DOWN = "node.down", "Node down"
    NODE_UP = "node.up", "Node up"
    WAITLIST_AVAILABLE = "waitlist.available", "Waitlisted GPUs available"
    WEBHOOK_DISABLED = "webhook.disabled", "Webhook disabled"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (retrying)"
    ABANDONED = "abandoned", "Abandoned"


class OutboxEvent(models.Model):
    """Something that happened, written in the transaction of the change; fanned out to webhooks and mail."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(db_index=True)
    event_type = models.CharField(max_length=64, db_index=True)
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    subject = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True)
    # Set once its deliveries exist; the sweep fans out rows still without it.
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["created_at"], condition=models.Q(dispatched_at__isnull=True), name="outbox_undispatched"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.subject}"


class WebhookEndpointQuerySet(ScopedQuerySet["WebhookEndpoint"]):
    team_path = "team"


class WebhookEndpoint(models.Model):
    """A URL that receives a team's (or, with no team, every team's) events of chosen types, signed."""

    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    url = models.URLField(max_length=500)
    events = models.JSONField(default=list)
    # The `whsec_` secret encrypted with a key derived from SECRET_KEY (apps/events/secrets.py).
    secret_encrypted = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    is_active = models.BooleanField(default=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=200, blank=True)
    # The first failure since the last success; a day of it disables the endpoint.
    failing_since = models.DateTimeField(null=True, blank=True)

    objects = WebhookEndpointQuerySet.as_manager()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.url


class WebhookDeliveryQuerySet(ScopedQuerySet["WebhookDelivery"]):
    team_path = "endpoint__team"


class WebhookDelivery(models.Model):
    """One event owed to one endpoint; its id is the stable `webhook-id` every retry carries."""

    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, related_name="webhook_deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # When it is owed next: also the lease while an attempt runs, so a dead worker's claim expires.
    next_attempt_at = models.DateTimeField(db_index=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = WebhookDeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["event", "endpoint"], name="webhookdelivery_unique_event")]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status__in=["pending", "failed"]),
                name="webhookdelivery_owed",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.endpoint_id} ({self.status})"

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.event.uuid.hex}_{self.endpoint_id}"


class MailPreference(models.Model):
    """Which events a person wants by mail: off until they opt in, but budget thresholds, which managers get unless
    they opt out (billing sends that mail)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mail_preference")
    job_finished = models.BooleanField(default=False)
    job_failed = models.BooleanField(default=False)
    reservation_starting = models.BooleanField(default=False)
    idle_warnings = models.BooleanField(default=False)
    budget_thresholds = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"mail preferences of {self.user}"


class MailDelivery(models.Model):
    """One event's mail to one person; sent at least once from the outbox."""

    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, related_name="mail_deliveries")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["event", "user"], name="maildelivery_unique_event_user")]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.user_id} ({self.status})"
