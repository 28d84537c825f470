"""Django's PostgreSQL backend, with a health check of persistent connections that polls the socket instead of
sending `SELECT 1`.

Used as ENGINE ("portal.pgbackend") for every database (portal/settings.py).

With CONN_MAX_AGE and CONN_HEALTH_CHECKS, Django calls `is_usable()` (`SELECT 1`) before the first statement of
every Celery task and scheduler pass. An idle connection's socket has nothing to read unless the server wrote to
it: when PostgreSQL closes a connection (a restart, an administrator's pg_terminate_backend, idle_session_timeout)
it sends an error and closes the socket, which then reads as ready. So the check looks at the socket without
waiting (one poll system call) and asks the server only when something is there. A connection that died silently
(a network partition) fails its first statement instead: a Celery task fails and Django closes the connection
(errors_occurred) before the next task. The web process's pool keeps psycopg_pool's own check at checkout.
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


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        # Django calls this outside any transaction (close_if_health_check_failed), so the connection is idle.
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if _server_wrote(conn):
            return bool(super().is_usable())  # something arrived: SELECT 1 says whether the session still lives
        return True
