"""Celery tasks for events: thin, idempotent, taking ids (the outbox rows are the record, messages only nudges)."""

from __future__ import annotations

from celery import shared_task

from apps.events import conf, delivery, mail, outbox, reminders


def _send(owed: outbox.Owed) -> None:
    for pk in owed.webhooks:
        deliver_webhook.delay(pk)
    for pk in owed.mails:
        deliver_mail.delay(pk)


def _soon(delay: int | None) -> bool:
    """Whether to schedule the retry as a delayed message: only within a sweep period. Longer waits are left to
    the sweep, so no worker holds hours of delayed messages (which Redis would also hand out again after its
    visibility timeout)."""
    return delay is not None and delay <= conf.SWEEP_EVERY_S


# Celery ships no type information: its task decorator is untyped, hence the ignore on each task.
@shared_task(name="events.dispatch", queue="portal", time_limit=60, soft_time_limit=50, ignore_result=True)  # type: ignore[untyped-decorator]
def dispatch_event(event_id: int) -> None:
    """Create an event's webhook and mail deliveries and send them."""
    _send(outbox.dispatch_event(event_id))


@shared_task(name="events.dispatch_many", queue="portal", time_limit=120, soft_time_limit=100, ignore_result=True)  # type: ignore[untyped-decorator]
def dispatch_many(event_ids: list[int]) -> None:
    """Fan out a batch of events (the after-commit nudges of one process, see apps/events/nudge.py)."""
    for event_id in event_ids:
        _send(outbox.dispatch_event(event_id))


@shared_task(name="events.deliver_webhook", queue="portal", time_limit=60, soft_time_limit=50, ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_webhook(delivery_id: int) -> None:
    """One attempt; a failure schedules the next after its backoff (the sweep also finds it if this is lost)."""
    delay = delivery.deliver_webhook(delivery_id)
    if _soon(delay):
        deliver_webhook.apply_async(args=[delivery_id], countdown=delay)


@shared_task(name="events.deliver_mail", queue="portal", time_limit=120, soft_time_limit=100, ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_mail(delivery_id: int) -> None:
    """Send one mail; a failure schedules the next attempt after its backoff."""
    delay = mail.deliver_mail(delivery_id)
    if _soon(delay):
        deliver_mail.apply_async(args=[delivery_id], countdown=delay)


@shared_task(name="events.sweep", queue="portal", time_limit=120, soft_time_limit=100, ignore_result=True)  # type: ignore[untyped-decorator]
def sweep() -> None:
    """Fan out undispatched events and re-send owed deliveries (periodic: what makes a lost message harmless)."""
    _send(outbox.sweep())


@shared_task(name="events.remind_reservations", queue="portal", time_limit=60, soft_time_limit=50, ignore_result=True)  # type: ignore[untyped-decorator]
def remind_reservations() -> int:
    """Publish "starting soon" for reservations about to start (periodic; each reservation once)."""
    return len(reminders.remind_reservations_starting())


@shared_task(name="events.purge", queue="portal", time_limit=300, soft_time_limit=240, ignore_result=True)  # type: ignore[untyped-decorator]
def purge() -> int:
    """Delete delivered events past their retention (hourly)."""
    return outbox.purge()
