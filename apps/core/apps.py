from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Shared plumbing: the error type and its HTTP mapping, idempotency keys, health, pagination."""

    name = "apps.core"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"
