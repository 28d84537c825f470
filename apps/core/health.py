"""Health checks that really touch the database and the broker, each with a short timeout."""

from __future__ import annotations

import functools

import redis
from django.conf import settings
from django.db import connection
from redis.backoff import NoBackoff
from redis.retry import Retry


def check_database() -> str | None:
    """None when healthy, else a short reason."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        connection.close_if_unusable_or_obsolete()
        return exc.__class__.__name__
    return None


@functools.lru_cache(maxsize=4)
def _probe_client(url: str) -> redis.Redis:
    """A client for the health probe only: short timeouts and no retries, so a hung Redis is reported in about a
    second instead of after the shared client's timeouts and retries (seen: 20 s)."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0))


def check_broker() -> str | None:
    try:
        _probe_client(settings.REDIS.redis_py_url).ping()
    except Exception as exc:
        return exc.__class__.__name__
    return None


def health_report() -> tuple[bool, dict[str, str]]:
    db_error = check_database()
    broker_error = check_broker()
    ok = db_error is None and broker_error is None
    report = {
        "status": "ok" if ok else "unavailable",
        "database": "ok" if db_error is None else "down",
        "broker": "ok" if broker_error is None else "down",
    }
    return ok, report
