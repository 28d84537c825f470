"""Load demo data, idempotently: each app's `demo.load()` in INSTALLED_APPS order (accounts first)."""

from __future__ import annotations

import importlib
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Load the demo teams, users, fleet, bookings, jobs and usage history (never in production)."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.PORTAL_ALLOW_DEMO:
            raise CommandError("Demo data is refused with PORTAL_PRODUCTION=1.")
        for config in apps.get_app_configs():
            if not config.name.startswith("apps."):
                continue
            try:
                module = importlib.import_module(f"{config.name}.demo")
            except ModuleNotFoundError as exc:
                if exc.name == f"{config.name}.demo":
                    continue
                raise
            module.load()
            self.stdout.write(f"demo: {config.label} loaded")
