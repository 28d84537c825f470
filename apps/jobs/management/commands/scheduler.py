"""`python manage.py scheduler`: the job scheduler (one leader at a time; start as many as you like)."""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.jobs import conf
from apps.jobs.scheduler import SchedulerLoop
from apps.jobs.scheduler.loop import configured_policy
from apps.jobs.scheduling import POLICIES


class Command(BaseCommand):
    help = "Run the job scheduler: a pass every second and on events, while this process is the leader."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--policy", choices=sorted(POLICIES), default=conf.SCHEDULER_POLICY)
        parser.add_argument("--interval", type=float, default=conf.SCHEDULER_INTERVAL_S, help="seconds between passes")
        parser.add_argument("--once", action="store_true", help="one pass (if leader) and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        loop = SchedulerLoop(
            policy=configured_policy(options["policy"]),
            interval=options["interval"],
            log=lambda line: self.stdout.write(line),
        )
        if options["once"]:
            result = loop.step()
            loop.leadership.release()
            self.stdout.write(f"pass: {result}")
            return

        def on_signal(signum: int, frame: object) -> None:
            loop.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        loop.run()
