"""Django's PostgreSQL backend, with a cheaper check of a pooled connection before a request gets it.

Used as ENGINE ("portal.pgpool") when the web process has a connection pool (DB_POOL_MAX_SIZE, portal/settings.py).

Django's pool (with CONN_HEALTH_CHECKS) runs psycopg_pool's `check_connection` on every checkout: an empty query,
one round trip to PostgreSQL before every request's first statement. A pooled connection is idle, so its socket has
nothing to read unless the server wrote to it: when PostgreSQL closes a connection (a restart, an administrator's
pg_terminate_backend, idle_session_timeout) it sends an error and closes the socket, which then reads as ready.
So the check looks at the socket without waiting (one poll system call) and does the full round trip only when
something is there. A connection that died silently (a network partition) fails the request's first statement
instead (503, DatabaseUnavailableMiddleware), and the pool discards it when it comes back broken.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base


def check_pooled_connection(conn: Any) -> None:
    """psycopg_pool's `check` callback: raise if `conn` must not be handed out."""
    if conn.closed or conn.broken:
        raise ConnectionError("the pooled connection is closed")
    poller = select.poll()  # not select.select: a busy process may hold file descriptors above 1024
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
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
