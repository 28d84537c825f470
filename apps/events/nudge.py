"""After-commit nudges to the fan-out task, sent by one background thread per process.

A Celery publish costs the committing thread a millisecond or more (more under load), and `publish()` runs in hot
transactions (every job transition). So the commit only queues the event id (microseconds); a daemon thread sends
whatever has queued as one `events.dispatch_many` message. A nudge lost with the process (or the broker) costs only
latency: the outbox row stays undispatched and the periodic sweep fans it out. Restarted after a fork (Celery's
prefork pool)."""

from __future__ import annotations

import logging
import os
import queue
import threading

from celery import current_app

logger = logging.getLogger(__name__)

BATCH_MAX = 500


class _Nudger:
    def __init__(self) -> None:
        self.pid = 0
        self.ids: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.lock = threading.Lock()

    def push(self, event_id: int) -> None:
        if self.pid != os.getpid():
            with self.lock:
                if self.pid != os.getpid():
                    self.ids = queue.SimpleQueue()
                    threading.Thread(target=self._run, args=(self.ids,), name="events-nudge", daemon=True).start()
                    self.pid = os.getpid()
        self.ids.put(event_id)

    def _run(self, ids: queue.SimpleQueue[int]) -> None:
        while True:
            batch = [ids.get()]
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(ids.get_nowait())
                except queue.Empty:
                    break
            try:
                current_app.send_task("events.dispatch_many", args=[batch], queue="portal")
            except Exception as exc:  # the broker is away: the sweep fans these out later
                logger.warning("events: %d dispatch nudges not sent (%s); the sweep will", len(batch), exc)


_nudger = _Nudger()


def nudge(event_id: int) -> None:
    """Ask for the event's fan-out soon (call after commit)."""
    _nudger.push(event_id)
