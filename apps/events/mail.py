"""Send one event's mail to one person, at least once, through Django's mail settings (EMAIL_HOST, ...)."""

from __future__ import annotations

import datetime as dt
import re

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import F
from django.utils import timezone

from apps.events import conf
from apps.events.matching import backoff_s
from apps.events.models import DeliveryStatus, MailDelivery, OutboxEvent
from apps.events.outbox import OWED, lease_until

MAX_ATTEMPTS = 12


# The page that shows an event's subject: "reservations/42" -> "/book/reservations/42/".
_PAGES = [
    (re.compile(r"^jobs/(\d+)$"), "/jobs/{}/"),
    (re.compile(r"^reservations/(\d+)$"), "/book/reservations/{}/"),
    (re.compile(r"^webhooks/(\d+)$"), "/events/webhooks/{}/"),
    (re.compile(r"^waitlist/\d+$"), "/book/"),
    (re.compile(r"^teams/[^/]+/budget/"), "/costs/"),
    (re.compile(r"^nodes/"), "/fleet/"),
]


def page_url(subject: str) -> str | None:
    """The address of the portal page about `subject`, where PORTAL_URL says where the portal is; else None (a mail
    cannot be given the request's host: it is sent by a worker, not in answer to a request)."""
    base = settings.PORTAL_URL.rstrip("/")
    if not base:
        return None
    for pattern, path in _PAGES:
        if match := pattern.match(subject):
            return base + path.format(*match.groups())
    return None


def render(event: OutboxEvent) -> tuple[str, str]:
    """Subject and plain-text body of an event's mail: what happened, its data, and a link to its page."""
    name = getattr(settings, "PORTAL_NAME", "GPU Portal")
    title = event.event_type.replace(".", " ").replace("_", " ")
    lines = [f"{title.capitalize()}: {event.subject}", ""]
    if url := page_url(event.subject):
        lines += [f"Open: {url}", ""]
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
