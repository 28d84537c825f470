"""Health checks that really touch the database and the broker, each with a short timeout."""

from __future__ import annotations

from django.db import connection

from apps.core.redis import get_redis


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


def check_broker() -> str | None:
    try:
        get_redis().ping()
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
