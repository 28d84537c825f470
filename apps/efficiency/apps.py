from django.apps import AppConfig


class EfficiencyConfig(AppConfig):
    """Idle GPUs warned and reclaimed, unused reservations released, the waitlist, OOM guidance and the
    efficiency report."""

    name = "apps.efficiency"
    label = "efficiency"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from apps.efficiency import conf, waitlist

        # The scan is idempotent (conditional updates per mark and per reservation), so a doubled tick is harmless;
        # its message expires with its period so a worker that was down finds no backlog.
        settings.CELERY_BEAT_SCHEDULE.setdefault(
            "efficiency-idle-scan",
            {
                "task": "efficiency.idle_scan",
                "schedule": float(conf.SCAN_EVERY_S),
                "options": {"queue": "portal", "expires": float(conf.SCAN_EVERY_S)},
            },
        )
        waitlist.connect()
        # The banner on every page also tells a holder that a GPU layout change moved or ended their booking.
        from apps.booking.hooks import register_reservation_rehomed
        from apps.efficiency.services import tell_rehomed

        register_reservation_rehomed(tell_rehomed)
