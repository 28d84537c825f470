"""Write events and webhook endpoints.

`publish` is the one entry point for the rest of the portal: call it inside the transaction of the change, so the
event exists iff the change does (the outbox pattern). Delivery to webhooks and mail happens from the outbox in
Celery, after commit, and again from the periodic sweep for anything a lost message left owed."""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction
from django.utils import timezone

from apps.events.models import OutboxEvent

logger = logging.getLogger(__name__)


def publish(
    event_type: str,
    *,
    team_id: int | None,
    subject: str,
    data: dict[str, object],
    user_id: int | None = None,
) -> None:
    """Record `event_type` (e.g. "job.succeeded") about `subject` (e.g. "jobs/42") for the team's webhooks and
    the user's mail. Writes one row in the caller's transaction; the fan-out task is sent after commit."""
    event = OutboxEvent.objects.create(
        created_at=timezone.now(),
        event_type=event_type,
        team_id=team_id,
        user_id=user_id,
        subject=subject[:200],
        data=data,
    )
    event_id = event.pk
    transaction.on_commit(lambda: _enqueue_dispatch(event_id))


def _enqueue_dispatch(event_id: int) -> None:
    # By name, so this module does not import the tasks that call it. A broker that is down loses only the nudge:
    # the sweep finds the undispatched row.
    try:
        current_app.send_task("events.dispatch", args=[event_id], queue="portal")
    except Exception as exc:  # the outbox row is the record; the sweep sends it later
        logger.warning("events: dispatch of event %s not enqueued (%s); the sweep will", event_id, exc)
