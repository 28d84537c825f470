"""`manage.py create_pool_token NAME --backend slurm [--partition gpu]`: create a bridged pool and print its bridge's
token (shown once)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.pools.services import pool_create_token


class Command(BaseCommand):
    help = "Create (or re-key) a bridged pool and print its bridge token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--backend", default="slurm")
        parser.add_argument("--partition", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        extra = {"partition": options["partition"]} if options["partition"] else None
        _, token = pool_create_token(name=options["name"], backend=options["backend"], options=extra)
        self.stdout.write(token)
