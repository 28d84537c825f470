"""Split a GPU into N equal shares (1: exclusive again): `manage.py gpu_shares GPU-UUID 4`. Refused while the GPU
or one of its shares is held now or later, and for a GPU in MIG mode (its instances are its parts). The same as
`POST /api/v1/gpus/{uuid}/shares/` and the GPU page's control for admins."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.booking.services import gpu_shares_change
from apps.core.errors import ApplicationError


class Command(BaseCommand):
    help = "Split a GPU into N equal shares for fractional bookings and jobs (1: exclusive)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("uuid")
        parser.add_argument("shares", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            gpu, _shares = gpu_shares_change(actor=None, gpu_uuid=options["uuid"], shares=options["shares"])
        except ApplicationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{gpu.uuid}: {gpu.shares} share(s)")
