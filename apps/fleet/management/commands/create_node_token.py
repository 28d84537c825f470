"""`manage.py create_node_token NODE`: create the node if needed, give it a new token, print the token alone."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.fleet import services


class Command(BaseCommand):
    help = "Issue a node token for NODE (creating the node); the previous token stops working. Prints only the token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            _, plaintext = services.node_token_issue(node_name=options["node"])
        except ApplicationError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(plaintext)
