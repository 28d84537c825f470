from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Teams, memberships, personal API tokens, and the one place where visibility is decided."""

    name = "apps.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.accounts import schema  # noqa: F401 - registers the OpenAPI security schemes
