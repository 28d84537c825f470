"""The secret key of a user's iCal feed."""

from __future__ import annotations

import secrets

from django.db import transaction

from apps.accounts.types import User
from apps.audit.services import audit_record
from apps.booking.models import CalendarFeed


def calendar_feed_regenerate(*, user: User) -> str:
    """A new secret key for the user's iCal feed (the old URL stops working). Returns the key; only its hash
    is stored, so it is shown once."""
    key = secrets.token_urlsafe(32)
    with transaction.atomic():
        feed, _ = CalendarFeed.objects.update_or_create(user=user, defaults={"digest": CalendarFeed.key_digest(key)})
        audit_record(actor=user, action="calendar_feed.regenerate", target=feed)
    return key
