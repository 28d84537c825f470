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
