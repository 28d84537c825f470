"""One redis-py client per kombu channel, instead of one per broker operation.

kombu's Redis transport builds a new `redis.Redis` for every publish, every QoS bookkeeping step of a received
message and every ack (`Channel.conn_or_acquire`), all on the channel's one connection pool, and building one copies
redis-py's table of response callbacks: a visible share of every task's CPU in the portal's worker and the node
agents (bench/internals_workers.py). A `redis.Redis` is safe to share between threads (each command takes a
connection from the pool; pipelines are separate objects), so the channel keeps the one it built, and builds a new
one when kombu replaces the pool (after a fork or a reconnect). A speed fix: kombu is correct without it.

Installed by the portal's Celery app (portal/celery.py) and the agent's (workers/transport.py). No Django here.
What it depends on in kombu, and the test that fails when that changes: workers/internals/README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

_ATTR = "_gpuportal_client"


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    if client:
        yield client
        return
    pool = self.pool  # kombu makes it on first use and again after _disconnect_pools
    cached = self.__dict__.get(_ATTR)
    if cached is None or cached.connection_pool is not pool:
        cached = self._create_client()
        self.__dict__[_ATTR] = cached
    yield cached


def reuse_redis_clients() -> bool:
    """Install the shared client on kombu's Redis channel (idempotent). False when kombu's channel does not look
    as expected (another kombu version): then nothing changes."""
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # pragma: no cover - kombu[redis] is a dependency
        return False
    channel = kombu_redis.Channel
    if getattr(channel.conn_or_acquire, "_gpuportal", False):
        return True
    if not all(hasattr(channel, name) for name in ("pool", "_create_client", "conn_or_acquire")):
        logger.warning("kombu's Redis channel changed; not sharing redis clients")
        return False
    _conn_or_acquire._gpuportal = True  # type: ignore[attr-defined]
    channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]
    return True
