"""`{% load billing_tags %}{% billing_notifications %}`: a badge for the page header with the user's teams' recent
budget notifications (last 14 days), linking to the Costs page; nothing when there are none."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()
RECENT = timedelta(days=14)


@register.inclusion_tag("billing/_notification_badge.html", takes_context=True)
def billing_notifications(context: template.Context) -> dict[str, Any]:
    from apps.billing.selectors import notifications_for

    user = context.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return {"notes": []}
    since = timezone.now() - RECENT
    notes = [n for n in notifications_for(user=user, limit=5) if n.created_at >= since]
    return {"notes": notes, "worst": "danger" if any(n.level == "danger" for n in notes) else "warning"}
