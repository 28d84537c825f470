from django.apps import AppConfig


class PoolsConfig(AppConfig):
    """Pools and their backends: the portal's own agents, or an existing scheduler (Slurm) fronted by a bridge."""

    name = "apps.pools"
    label = "pools"
    default_auto_field = "django.db.models.BigAutoField"
