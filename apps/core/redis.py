"""A shared redis-py client for the portal process (cache, telemetry, pub/sub), built from settings.REDIS."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS.redis_py_url,
        socket_connect_timeout=2,
        socket_timeout=5,
        health_check_interval=15,
        retry_on_timeout=True,
    )


@functools.cache
def get_request_redis() -> redis.Redis:
    """A client for reads on the request path (pages, API): 1 s timeouts and no retries, so a Redis that hangs
    costs a request about a second, not the shared client's timeout times its retries (20 s with redis-py 8's
    default of three retries). Callers treat a failure as "no live data" and answer without it."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        settings.REDIS.redis_py_url, socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )
