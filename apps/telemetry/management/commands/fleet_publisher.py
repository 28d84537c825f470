"""`manage.py fleet_publisher`: publish the fleet snapshot on `fleet:snapshots` once a second until stopped."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.telemetry.publisher import FleetPublisher


class Command(BaseCommand):
    help = (
        "Publish one JSON fleet snapshot a second on the Redis channel fleet:snapshots (see apps/telemetry/README.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", type=float, default=1.0, help="seconds between snapshots")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        publisher = FleetPublisher(period_s=options["period"])
        self.stdout.write(f"fleet publisher: a snapshot every {options['period']} s on fleet:snapshots")
        publisher.run(stop)
        self.stdout.write(f"fleet publisher stopped after {publisher.published} snapshot(s)")
