"""Shared tables: idempotency keys for POSTs."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class IdempotencyRecord(models.Model):
    """The first response to a POST carrying an Idempotency-Key, replayed for retries with the same key."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="sha256 of the request body")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, help_text="null while in progress")
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_unique_user_key")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_at")]  # the hourly purge

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key}"
