from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Append-only log of who changed what."""

    name = "apps.audit"
    label = "audit"
    default_auto_field = "django.db.models.BigAutoField"
