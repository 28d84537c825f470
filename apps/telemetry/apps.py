from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Live GPU samples (Redis) and their per-minute and per-hour rollups (database)."""

    name = "apps.telemetry"
    label = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"
