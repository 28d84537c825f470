"""Websocket broadcasts from synchronous code: one event-loop thread per process sends channel-layer group
messages, so a writer never waits for Redis.

Best effort, after commit: a broadcast lost while Redis restarts costs a live page a message (pages re-read what
they show on reconnect). Callers use `send_on_commit(group, message)` inside their transaction.

async_to_sync per message would build a loop and block the writer (~3 ms each); the scheduler starting fifty
jobs, or the worker applying a burst of reports, would pay that fifty times. The channel layer is bound to the
loop that uses it, so all sends go through this one loop. Recreated after a fork (Celery's prefork pool).

Messages queue up while the loop works and go out in batches, in the order they were committed. A batch first
asks Redis which of its groups have a member (`portal.internals.channels_groups`, one pipelined EXISTS) and sends
only to those: most groups are watched by nobody (a job's page, an open Book page), and a group_send costs two
round trips and a task on the loop even for an empty group (`bench/broadcasts.py` measures it). A page that joins
a group after the check misses nothing: consumers join first and then read what they show, which by then has the
committed change.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from django.db import transaction

from portal.internals.channels_groups import watched_groups

logger = logging.getLogger(__name__)


class Broadcaster:
    """The process's broadcast loop: `send(group, message)` queues; one drain at a time sends in order."""

    def __init__(self) -> None:
        self.pid = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.pending: list[tuple[str, dict[str, Any]]] = []
        self.draining = False
        self.skip_unwatched = True  # bench/broadcasts.py turns it off to measure what the check saves

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="broadcasts", daemon=True).start()
                self.loop, self.pid = loop, os.getpid()
                self.pending, self.draining = [], False
            return self.loop

    def send(self, group: str, message: dict[str, Any]) -> None:
        loop = self._ensure()
        with self.lock:
            self.pending.append((group, message))
            if self.draining:  # the running drain takes it with its next batch
                return
            self.draining = True
        asyncio.run_coroutine_threadsafe(self._drain(), loop)

    def idle(self) -> bool:
        """Whether every queued message has been sent or dropped."""
        with self.lock:
            return not self.draining and not self.pending

    async def _drain(self) -> None:
        from channels.layers import get_channel_layer

        while True:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    self.draining = False
                    return
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await self._deliver(layer, batch)
            except Exception:  # a batch lost, never the drain: later messages must still go out
                logger.exception("broadcasting %d messages failed", len(batch))

    async def _deliver(self, layer: Any, batch: list[tuple[str, dict[str, Any]]]) -> None:
        watched = await watched_groups(layer, {group for group, _ in batch}) if self.skip_unwatched else None
        for group, message in batch:
            if watched is not None and group not in watched:
                continue
            try:
                await layer.group_send(group, message)
            except Exception as exc:  # a live view missing a message must never fail anything
                logger.warning("broadcast to %s failed: %s", group, exc)


broadcaster = Broadcaster()


def send(group: str, message: dict[str, Any]) -> None:
    """Queue `message` (a channel-layer message: `type` names the consumer's handler) for `group` now."""
    broadcaster.send(group, message)


def send_on_commit(group: str, message: dict[str, Any]) -> None:
    """Queue `message` for `group` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: broadcaster.send(group, message))
