"""Who may schedule: one leader at a time, by a PostgreSQL advisory lock, with a fencing token per leadership.

The lock is held by a dedicated psycopg connection (not Django's, so no transaction handling can drop it) and lives
as long as that connection: when a leader dies the server frees it and a waiting process takes over within a pass.
Each leadership takes a token one above the `SchedulerState.fence` row; the apply transaction moves the fence to
its token with a conditional UPDATE and gives up if a newer leader already wrote there, so a paused ex-leader
cannot apply stale decisions.

Why an advisory lock and not a Redis lock (redis-py's `Lock` with a timeout it extends every pass): the lock
lives in the database the decisions are written to, it is freed the moment the holder's connection dies (no lease
to wait out, no renewal to miss under load), and the fence it guards is in the same database.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import psycopg
from django.conf import settings
from django.db import transaction

from apps.jobs.models import SchedulerState

logger = logging.getLogger(__name__)

ADVISORY_KEY = 0x4A4F4253  # "JOBS"


class Leadership(Protocol):
    token: int

    def acquire(self) -> bool:
        """Try to become leader (non-blocking); True if this process is the leader now."""
        ...

    def still_leader(self) -> bool:
        """Check the leadership before a pass."""
        ...

    def release(self) -> None: ...


class NotLeader(Exception):
    """A newer leader has applied decisions since this one took over: stop applying."""


class PostgresLeadership:
    """`pg_try_advisory_lock` held by a dedicated psycopg connection for as long as this process leads."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.token = 0

    def _connect(self) -> psycopg.Connection[Any]:
        db = settings.DATABASES["default"]
        return psycopg.connect(
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            dbname=db["NAME"],
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            autocommit=True,
            connect_timeout=5,
            application_name="gpu-portal-scheduler-lock",
        )

    def acquire(self) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self._connect()
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY]).fetchone()
        except Exception as exc:
            logger.warning("scheduler lock: %s", exc)
            self._drop()
            return False
        if not row or not row[0]:
            return False
        # The token: one more than any leader before (the fence row's value), taken while holding the lock.
        self.token = next_fence()
        return True

    def still_leader(self) -> bool:
        if self.conn is None:
            return False
        try:
            self.conn.execute("SELECT 1").fetchone()
            return True
        except Exception as exc:
            logger.warning("scheduler lock connection lost: %s", exc)
            self._drop()
            return False

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: S110 - already broken
                pass
        self.conn = None

    def release(self) -> None:
        if self.conn is not None:
            try:
                self.conn.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])
            except Exception:  # noqa: S110 - closing the connection frees it anyway
                pass
        self._drop()


def next_fence() -> int:
    """One above the highest token that applied decisions (the caller holds the advisory lock)."""
    with transaction.atomic():
        state, _ = SchedulerState.objects.select_for_update().get_or_create(pk=1)
        return state.fence + 1
