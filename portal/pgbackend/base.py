"""Django's PostgreSQL backend, with connection checks that cost a poll of the socket instead of a round trip.

Used as ENGINE ("portal.pgbackend") for every PostgreSQL database (portal/settings.py).

Django's health checks (CONN_HEALTH_CHECKS) send a query before a connection is used again: psycopg_pool's
`check_connection` (an empty query) on every checkout from the web process's pool, and `SELECT 1` from `is_usable()`
before the first statement of every Celery task or scheduler pass on a persistent connection (CONN_MAX_AGE). In the
jobs benchmark those were one statement in ten. An idle connection's socket has nothing to read unless the server
wrote to it: when PostgreSQL closes a connection (a restart, an administrator's pg_terminate_backend,
idle_session_timeout) it sends an error and closes the socket, which then reads as ready. So the checks look at the
socket without waiting (one poll system call) and do the full round trip only when something is there. A connection
that died silently (a network partition) fails its first statement instead: the web process answers 503
(DatabaseUnavailableMiddleware) and the pool discards the connection when it comes back broken; a Celery task fails
and Django closes the connection (errors_occurred) before the next task.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base


def _server_wrote(conn: Any) -> bool:
    """Whether an idle connection's socket has something to read (or is closed): then only a query can tell."""
    poller = select.poll()  # not select.select: a busy process may hold file descriptors above 1024
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


def check_pooled_connection(conn: Any) -> None:
    """psycopg_pool's `check` callback: raise if `conn` must not be handed out."""
    if conn.closed or conn.broken:
        raise ConnectionError("the pooled connection is closed")
    if _server_wrote(conn):
        from psycopg_pool import ConnectionPool

        ConnectionPool.check_connection(conn)  # the server said something (a closing error?): ask it for real


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        # Django builds the pool with check=ConnectionPool.check_connection (CONN_HEALTH_CHECKS) and offers no
        # option to choose another; psycopg_pool keeps it in `_check`. Anything else (another psycopg_pool
        # version, health checks off): left as Django made it.
        if pool is not None and getattr(pool, "_check", None) is not None:
            from psycopg_pool import ConnectionPool

            if pool._check is ConnectionPool.check_connection:
                pool._check = check_pooled_connection
        return pool

    def is_usable(self) -> bool:
        # Django calls this outside any transaction (close_if_health_check_failed), so the connection is idle.
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if _server_wrote(conn):
            return bool(super().is_usable())  # something arrived: SELECT 1 says whether the session still lives
        return True
