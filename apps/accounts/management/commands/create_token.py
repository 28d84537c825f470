"""`manage.py create_token USER --scope read [--scope ...] [--expires-days N]`: prints the token alone, for scripts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts import services
from apps.accounts.models import Scope
from apps.core.errors import ApplicationError


class Command(BaseCommand):
    help = "Create a personal API token for USER and print it (only the token) on stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--scope", action="append", dest="scopes", choices=[s.value for s in Scope], required=True)
        parser.add_argument("--expires-days", type=int, default=90, help="0 for no expiry")
        parser.add_argument("--name", default="created by manage.py create_token")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        expires = options["expires_days"] or None
        try:
            _, plaintext = services.token_create(
                user=user, name=options["name"], scopes=options["scopes"], expires_days=expires
            )
        except ApplicationError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(plaintext)
