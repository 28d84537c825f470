from django.apps import AppConfig


class EventsConfig(AppConfig):
    """The event outbox, signed webhooks (CloudEvents + Standard Webhooks) and mail notifications."""

    name = "apps.events"
    label = "events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from apps.events import conf

        # The sweep is what makes delivery survive a lost broker message (a Redis restart, a killed worker): it
        # re-enqueues whatever the database says is still owed. Messages expire with their period.
        schedule = {
            "events-sweep": ("events.sweep", conf.SWEEP_EVERY_S),
            "events-remind-reservations": ("events.remind_reservations", conf.REMINDER_EVERY_S),
            "events-purge": ("events.purge", 3600),
        }
        for name, (task, every) in schedule.items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(
                name, {"task": task, "schedule": float(every), "options": {"queue": "portal", "expires": float(every)}}
            )
