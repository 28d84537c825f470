from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Teams, memberships, personal API tokens, and the one place where visibility is decided."""

    name = "apps.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.contrib.auth.signals import user_logged_out

        from apps.accounts import schema  # noqa: F401 - registers the OpenAPI security schemes
        from apps.core import socket_access

        # Signing out ends the websockets that session opened (the browser's other tabs), at once.
        user_logged_out.connect(socket_access.signed_out, dispatch_uid="socket-access-signed-out")

        # Hourly is plenty for a retention counted in days; the message expires with its period.
        settings.CELERY_BEAT_SCHEDULE.setdefault(
            "accounts-prune-tokens",
            {"task": "accounts.prune_tokens", "schedule": 3600.0, "options": {"queue": "portal", "expires": 3600.0}},
        )
