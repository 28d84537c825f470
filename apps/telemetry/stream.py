"""The lean telemetry path: agents XADD their 1 Hz messages to the stream `fleet:ingest`; this consumer reads them
in batches (XREADGROUP ... COUNT 500 BLOCK 1000 NOACK) and stores a whole batch in one Redis pipeline
(apps.telemetry.ingest.telemetry_ingest_batch).

Why not one Celery task per message: Celery's per-message work (kombu decode, request, trace, ack, several round
trips) costs ~1.7 ms of CPU against ~0.3 ms for the ingest itself, and a solo worker on a busy machine falls behind
at 125 messages a second (bench/fleet_ingest.py). Batching amortises the round trips and skips that machinery; the
Celery task `telemetry.ingest` stays for agents configured with `--telemetry-via celery`.

Several consumers may run (one consumer group: Redis hands each entry to one of them). No acknowledgements: a
consumer that dies loses at most the batch in hand, a second of samples. Once a second the stream is trimmed to
the last TELEMETRY_MAX_AGE_S seconds (XTRIM MINID), so after an outage the backlog is dropped, not replayed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections

from apps.core.redis import get_redis
from apps.telemetry import keys
from apps.telemetry.ingest import BatchResult, telemetry_ingest_batch

logger = logging.getLogger(__name__)


def ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(keys.INGEST_STREAM, keys.INGEST_GROUP, id="$", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def decode_entries(entries: Any) -> list[Any]:
    """The JSON messages of stream entries; an undecodable entry becomes None (refused as malformed by ingest)."""
    out: list[Any] = []
    for _id, fields in entries:
        raw = fields.get(b"m")
        try:
            out.append(json.loads(raw) if raw is not None else None)
        except (TypeError, ValueError):
            out.append(None)
    return out


class StreamIngestor:
    def __init__(self, *, consumer: str | None = None, batch: int = 500, block_ms: int = 1000) -> None:
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch
        self.block_ms = block_ms
        self.redis: Any = get_redis()
        self.totals = BatchResult()
        self._trimmed_at = 0.0
        self.failures = 0

    def trim(self, now: float) -> None:
        """Drop entries older than TELEMETRY_MAX_AGE_S (their stream id carries the time they were added)."""
        min_id = f"{int((now - settings.TELEMETRY_MAX_AGE_S) * 1000)}-0"
        # Exact, not approximate: consumed entries are deleted, so only a backlog is ever trimmed, and it is small.
        self.redis.xtrim(keys.INGEST_STREAM, minid=min_id, approximate=False)
        self._trimmed_at = now

    def poll_once(self) -> BatchResult:
        """Read one batch (waiting up to block_ms) and ingest it."""
        now = time.time()
        if now - self._trimmed_at >= 1.0:
            self.trim(now)
        try:
            response = self.redis.xreadgroup(
                keys.INGEST_GROUP,
                self.consumer,
                {keys.INGEST_STREAM: ">"},
                count=self.batch,
                block=self.block_ms,
                noack=True,
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            ensure_group(self.redis)  # Redis was restarted or flushed
            return BatchResult()
        if not response:
            return BatchResult()
        entries = response[0][1]
        result = telemetry_ingest_batch(decode_entries(entries))
        ids = [entry_id for entry_id, _ in entries]
        self.redis.xdel(keys.INGEST_STREAM, *ids)  # consumed: keep the stream (and its memory) short
        for name in ("messages", "accepted_samples", "stale", "rejected", "rejected_rows"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(result, name))
        return result

    def run(self, stop: threading.Event) -> None:
        ensure_group(self.redis)
        while not stop.is_set():
            try:
                result = self.poll_once()
                if result.messages:
                    close_old_connections()  # the node cache reads the database now and then
            except Exception:  # Redis or the database restarting: keep going
                self.failures += 1
                if self.failures == 1 or self.failures % 60 == 0:
                    logger.exception("telemetry ingest failed (%d failures)", self.failures)
                stop.wait(1.0)
