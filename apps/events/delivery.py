"""Attempt one webhook delivery: claim it, sign the CloudEvents envelope, POST it, record the outcome.

At least once: a delivery is claimed with a conditional UPDATE that also moves `next_attempt_at` to a lease, so
two workers never send it at the same moment and a worker killed mid-attempt leaves it owed again once the lease
runs out. A receiver may still see it twice (sent, then the worker died before recording it); the `webhook-id`
header is the same on every attempt so it can tell."""

from __future__ import annotations

import datetime as dt
import json
import time

import requests
from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from apps.audit.services import audit_record
from apps.events import conf, secrets
from apps.events.matching import backoff_s
from apps.events.models import DeliveryStatus, EventType, OutboxEvent, WebhookDelivery, WebhookEndpoint
from apps.events.outbox import OWED, lease_until
from apps.events.services import publish
from apps.events.ssrf import UnsafeUrl, check_url

SOURCE = "/gpu-portal"


def cloudevent(event: OutboxEvent) -> dict[str, object]:
    """The CloudEvents 1.0 JSON envelope of an outbox event."""
    return {
        "specversion": "1.0",
        "id": str(event.uuid),
        "source": getattr(settings, "PORTAL_EVENT_SOURCE", SOURCE),
        "type": f"portal.{event.event_type}",
        "time": event.created_at.isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "subject": event.subject,
        "data": event.data,
    }


def _claim(delivery_id: int, now: dt.datetime) -> bool:
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status__in=OWED, next_attempt_at__lte=now, endpoint__is_active=True
    ).update(next_attempt_at=lease_until(now), attempts=F("attempts") + 1, last_attempt_at=now)
    return claimed == 1


def _post(endpoint: WebhookEndpoint, msg_id: str, body: str) -> tuple[int | None, str]:
    """POST the body; (status code, error text). Redirects are not followed: they could lead anywhere."""
    try:
        check_url(endpoint.url)
    except UnsafeUrl as exc:
        return None, str(exc)
    try:
        signer = Webhook(secrets.decrypt(endpoint.secret_encrypted))
    except InvalidToken:
        return None, "The signing secret cannot be read (SECRET_KEY changed?): rotate it."
    sent_at = timezone.now()
    headers = {
        "content-type": "application/cloudevents+json; charset=utf-8",
        "user-agent": "gpu-portal-webhooks",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": signer.sign(msg_id, sent_at, body),
    }
    try:
        # Streamed and closed unread: only the status matters, and a receiver's large answer costs nothing.
        response = requests.post(
            endpoint.url,
            data=body.encode(),
            headers=headers,
            timeout=conf.TIMEOUT_S,
            allow_redirects=False,
            stream=True,
        )
        response.close()
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
    if 200 <= response.status_code < 300:
        return response.status_code, ""
    return response.status_code, f"HTTP {response.status_code}"


def deliver_webhook(delivery_id: int) -> int | None:
    """Attempt a delivery if it is owed now; the next attempt's delay in seconds when it failed, else None."""
    now = timezone.now()
    if not _claim(delivery_id, now):
        return None
    delivery = WebhookDelivery.objects.select_related("event", "endpoint").get(pk=delivery_id)
    body = json.dumps(cloudevent(delivery.event), separators=(",", ":"), sort_keys=True)
    started = time.monotonic()
    code, error = _post(delivery.endpoint, delivery.webhook_id, body)
    duration_ms = int((time.monotonic() - started) * 1000)
    finished = timezone.now()
    if not error:
        WebhookDelivery.objects.filter(pk=delivery_id).update(
            status=DeliveryStatus.SUCCEEDED,
            response_code=code,
            duration_ms=duration_ms,
            error="",
            delivered_at=finished,
        )
        WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, failing_since__isnull=False).update(failing_since=None)
        return None
    delay = backoff_s(delivery.attempts, base_s=conf.BACKOFF_BASE_S, max_s=conf.BACKOFF_MAX_S)
    WebhookDelivery.objects.filter(pk=delivery_id).update(
        status=DeliveryStatus.FAILED,
        response_code=code,
        duration_ms=duration_ms,
        error=error[:300],
        next_attempt_at=finished + dt.timedelta(seconds=delay),
    )
    _note_failure(delivery.endpoint_id, finished)
    return delay


def _note_failure(endpoint_id: int, now: dt.datetime) -> None:
    """Remember when the endpoint began failing; a day of failures without a success disables it. Locks the
    endpoint row so the disabling (and its mail and audit entry) happens once."""
    WebhookEndpoint.objects.filter(pk=endpoint_id, failing_since__isnull=True).update(failing_since=now)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().filter(pk=endpoint_id, is_active=True).first()
        if endpoint is None or endpoint.failing_since is None:
            return
        if (now - endpoint.failing_since).total_seconds() < conf.DISABLE_AFTER_S:
            return
        endpoint.is_active = False
        endpoint.disabled_at = now
        endpoint.disabled_reason = "Every delivery failed for a day."
        endpoint.save(update_fields=["is_active", "disabled_at", "disabled_reason"])
        audit_record(actor=None, action="webhook.disabled", target=endpoint, data={"url": endpoint.url})
        publish(
            EventType.WEBHOOK_DISABLED,
            team_id=endpoint.team_id,
            subject=f"webhooks/{endpoint.pk}",
            data={"id": endpoint.pk, "url": endpoint.url, "reason": endpoint.disabled_reason},
            user_id=endpoint.created_by_id,
        )
