"""One redis-py client per kombu channel, instead of one per broker operation. No Django here (agents use it too).

kombu's Redis transport (5.x) builds a new `redis.Redis` for every publish, every QoS bookkeeping step of a received
message and every ack (`Channel.conn_or_acquire`), all on the channel's one connection pool. Building one copies
redis-py's table of ~170 response callbacks; in the portal's worker and the node agents that was 5-8% of their
CPU (py-spy, 40 jobs/s). A `redis.Redis` is safe to share between threads (each command takes a connection from
the pool; pipelines are separate objects), so the channel keeps the one it built, and builds a new one when kombu
replaces the pool (after a fork or a reconnect).

Installed by the portal's Celery app (portal/celery.py) and the agent's (workers/transport.py).
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
    channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign,assignment]
    return True
