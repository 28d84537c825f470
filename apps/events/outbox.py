"""Fan events out of the outbox into deliveries, and find what is still owed.

Fan-out is idempotent (a unique row per event and endpoint or person, inserted with ON CONFLICT DO NOTHING) and
the event row is locked while it runs, so the task and the sweep may both try it: each delivery exists once."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.events import conf
from apps.events.matching import ALWAYS_MAILED, MAIL_PREFERENCE, selects
from apps.events.models import (
    DeliveryStatus,
    MailDelivery,
    MailPreference,
    OutboxEvent,
    WebhookDelivery,
    WebhookEndpoint,
)

OWED = (DeliveryStatus.PENDING, DeliveryStatus.FAILED)


@dataclass
class Owed:
    """Ids of deliveries to attempt now."""

    webhooks: list[int] = field(default_factory=list)
    mails: list[int] = field(default_factory=list)


def _mail_recipients(event: OutboxEvent) -> list[int]:
    if event.event_type in ALWAYS_MAILED:
        return [event.user_id] if event.user_id else []
    preference = MAIL_PREFERENCE.get(event.event_type)
    if preference is None:
        return []
    if not event.user_id:
        return []
    candidates = {event.user_id}
    opted = MailPreference.objects.filter(user_id__in=candidates, **{preference: True}, user__is_active=True)
    return sorted(opted.exclude(user__email="").values_list("user_id", flat=True))


def dispatch_event(event_id: int) -> Owed:
    """Create the event's deliveries (once) and return those to attempt now. Locks the event row."""
    now = timezone.now()
    with transaction.atomic():
        event = OutboxEvent.objects.select_for_update().filter(pk=event_id, dispatched_at__isnull=True).first()
        if event is None:
            return Owed()
        endpoints = WebhookEndpoint.objects.filter(is_active=True)
        endpoints = endpoints.filter(Q(team__isnull=True) | Q(team_id=event.team_id)) if event.team_id else endpoints
        endpoint_ids = [e.pk for e in endpoints.only("pk", "events") if selects(e.events, event.event_type)]
        WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(event=event, endpoint_id=pk, next_attempt_at=now) for pk in endpoint_ids],
            ignore_conflicts=True,
        )
        MailDelivery.objects.bulk_create(
            [MailDelivery(event=event, user_id=pk, next_attempt_at=now) for pk in _mail_recipients(event)],
            ignore_conflicts=True,
        )
        event.dispatched_at = now
        event.save(update_fields=["dispatched_at"])
        return Owed(
            webhooks=list(event.webhook_deliveries.values_list("pk", flat=True)),
            mails=list(event.mail_deliveries.values_list("pk", flat=True)),
        )


def sweep(*, limit: int = 500) -> Owed:
    """Fan out events a lost message left undispatched, and return the deliveries now owed (due retries, and
    claims whose worker died: their lease is `next_attempt_at`)."""
    owed = Owed()
    pending_events = OutboxEvent.objects.filter(dispatched_at__isnull=True).order_by("id")
    for event_id in pending_events.values_list("pk", flat=True)[:limit]:
        dispatch_event(event_id)
    now = timezone.now()
    owed.webhooks = list(
        WebhookDelivery.objects.filter(status__in=OWED, next_attempt_at__lte=now, endpoint__is_active=True)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    owed.mails = list(
        MailDelivery.objects.filter(status__in=OWED, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    return owed


def lease_until(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=conf.CLAIM_LEASE_S)


def purge(*, now: dt.datetime | None = None, limit: int = 5000) -> int:
    """Delete events older than EVENTS_RETENTION_DAYS that owe nothing any more (their deliveries go with them):
    the delivery log keeps that long. An event still owed to a disabled endpoint stays until it is delivered or
    the endpoint is deleted."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=conf.RETENTION_DAYS)
    done = (
        OutboxEvent.objects.filter(created_at__lt=cutoff, dispatched_at__isnull=False)
        .exclude(webhook_deliveries__status__in=OWED)
        .exclude(mail_deliveries__status__in=OWED)
        .order_by("id")
        .values_list("pk", flat=True)[:limit]
    )
    deleted, _ = OutboxEvent.objects.filter(pk__in=list(done)).delete()
    return int(deleted)
