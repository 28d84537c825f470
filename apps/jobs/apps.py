from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Containerized jobs: submission, the scheduler shell around the pure core, agent reports, logs."""

    name = "apps.jobs"
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        # The leader scheduler also sweeps lost nodes every pass; this beat entry is the backstop that repairs
        # jobs while no scheduler runs (e.g. during a deploy), and it is idempotent.
        settings.CELERY_BEAT_SCHEDULE.setdefault(
            "jobs-sweep",
            {"task": "jobs.sweep", "schedule": 15.0, "options": {"queue": "portal", "expires": 14}},
        )
        from apps.booking.hooks import register_reservation_ended
        from apps.jobs.hooks import stop_jobs_after_grace

        register_reservation_ended(stop_jobs_after_grace)
