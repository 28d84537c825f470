"""`manage.py ingest_telemetry`: consume the agents' telemetry stream (fleet:ingest) in batches until stopped."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.telemetry.stream import StreamIngestor


class Command(BaseCommand):
    help = "Store the agents' 1 Hz telemetry from the Redis stream fleet:ingest (see apps/telemetry/stream.py)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=500, help="messages per read")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        ingestor = StreamIngestor(batch=options["batch"])
        self.stdout.write(f"telemetry ingest: consumer {ingestor.consumer} on fleet:ingest")
        ingestor.run(stop)
        t = ingestor.totals
        self.stdout.write(
            f"telemetry ingest stopped: {t.messages} message(s), {t.accepted_samples} sample(s), {t.stale} stale, "
            f"{t.rejected} refused"
        )
