"""Send one event's mail to one person, at least once, through Django's mail settings (EMAIL_HOST, ...)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import F
from django.utils import timezone

from apps.events import conf
from apps.events.matching import backoff_s
from apps.events.models import DeliveryStatus, MailDelivery, OutboxEvent
from apps.events.outbox import OWED, lease_until

MAX_ATTEMPTS = 12


def render(event: OutboxEvent) -> tuple[str, str]:
    """Subject and plain-text body of an event's mail."""
    name = getattr(settings, "PORTAL_NAME", "GPU Portal")
    title = event.event_type.replace(".", " ").replace("_", " ")
    lines = [f"{title.capitalize()}: {event.subject}", ""]
    lines += [f"{key}: {value}" for key, value in sorted(event.data.items())]
    lines += ["", f"You receive this because of your mail preferences in {name} (Profile > Notifications)."]
    return f"[{name}] {title}: {event.subject}", "\n".join(lines)


def deliver_mail(delivery_id: int) -> int | None:
    """Send a mail if it is owed now; the next attempt's delay in seconds when sending failed, else None."""
    now = timezone.now()
    claimed = MailDelivery.objects.filter(pk=delivery_id, status__in=OWED, next_attempt_at__lte=now).update(
        next_attempt_at=lease_until(now), attempts=F("attempts") + 1
    )
    if claimed != 1:
        return None
    delivery = MailDelivery.objects.select_related("event", "user").get(pk=delivery_id)
    subject, body = render(delivery.event)
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [delivery.user.email], fail_silently=False)
    except Exception as exc:  # any SMTP or socket failure: try again later
        delay = backoff_s(delivery.attempts, base_s=conf.BACKOFF_BASE_S, max_s=conf.BACKOFF_MAX_S)
        give_up = delivery.attempts >= MAX_ATTEMPTS
        MailDelivery.objects.filter(pk=delivery_id).update(
            status=DeliveryStatus.ABANDONED if give_up else DeliveryStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:300],
            next_attempt_at=timezone.now() + dt.timedelta(seconds=delay),
        )
        return None if give_up else delay
    MailDelivery.objects.filter(pk=delivery_id).update(
        status=DeliveryStatus.SUCCEEDED, sent_at=timezone.now(), error=""
    )
    return None
