"""Split a GPU into N equal shares (1: exclusive again): `manage.py gpu_shares GPU-UUID 4`. Refused while the GPU
or one of its shares is held now or later, and for a GPU in MIG mode (its instances are its parts)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.fleet.devices import gpu_set_shares
from apps.fleet.models import Gpu


class Command(BaseCommand):
    help = "Split a GPU into N equal shares for fractional bookings and jobs (1: exclusive)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("uuid")
        parser.add_argument("shares", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        if not Gpu.objects.filter(uuid=options["uuid"]).exists():
            raise CommandError(f"no GPU {options['uuid']}")
        try:
            gpu = gpu_set_shares(actor=None, gpu_uuid=options["uuid"], shares=options["shares"])
        except ApplicationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{gpu.uuid}: {gpu.shares} share(s)")
