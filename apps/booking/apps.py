from django.apps import AppConfig


class BookingConfig(AppConfig):
    """Reservations, GPU allocations (the occupancy table), quotas, booking policy and maintenance windows."""

    name = "apps.booking"
    label = "booking"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from apps.booking.services.layout import LAYOUT_GUARD
        from apps.fleet.hooks import register_layout_guard

        # A node's change of MIG layout takes the scheduler's row first and moves or ends the bookings it strands.
        register_layout_guard(LAYOUT_GUARD)

        # Activate and release due reservations; idempotent, so a missed or doubled tick is harmless.
        settings.CELERY_BEAT_SCHEDULE.setdefault(
            "booking-lifecycle",
            {"task": "booking.lifecycle_tick", "schedule": 15.0, "options": {"queue": "portal", "expires": 14}},
        )
