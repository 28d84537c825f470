from django.apps import AppConfig


class FleetConfig(AppConfig):
    """GPU models, nodes and GPUs: what exists, where, and in what state."""

    name = "apps.fleet"
    label = "fleet"
    default_auto_field = "django.db.models.BigAutoField"
