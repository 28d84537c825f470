"""A per-process cache of the few rows every API request reads, dropped the moment PostgreSQL says they changed.

Why: every API request looks up its token with the token's user, and every booking and job submission the team
with the caller's membership. Those two one-row queries were a large share of a booking request's CPU in the web
process and of its statements in PostgreSQL (bench/booking_load.py), for rows that change a few times a day.

Why it stays right: triggers on the tables behind these rows (declared with django-pgtrigger in
apps/accounts/triggers.py) send `NOTIFY portal_rowcache` on every change, delivered when the changing transaction
commits. Each web process has one thread that LISTENs on a connection of its own and, for every notification, moves
a generation counter on and empties the cache; an entry counts only under the generation read before its query was
sent, so a row read just before a change committed is never served after the notification arrived. The window that
remains is the one between a commit and its notification reaching the process (a millisecond or so; the same as a
request that started just before the change). While the listener is not connected and confirmed alive (process
start, database restart, a silent network failure, a pooler that swallows notifications: every HEARTBEAT_S it sends
a notification to itself and counts as alive only while they come back), nothing is served from the cache and every
lookup goes to the database. Entries also expire after MAX_AGE_S, a backstop should a notification ever be lost.

Others in the process may hear the same notifications (`subscribe`): open websockets check again who may watch
them when a user, a team, a membership or a token changes (apps/core/socket_access.py).

Lookups inside a transaction (`atomic`) skip the cache: that transaction may itself have changed the rows, and
its notification is only sent at commit. On by default in the web process (portal/asgi.py); `DB_ROW_CACHE=0`
turns it off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from apps.core import rawsql
from apps.core.ttlcache import TTLCache

logger = logging.getLogger(__name__)

CHANNEL = "portal_rowcache"  # the channel apps/accounts/triggers.py notifies
HEARTBEAT_S = 5.0  # a NOTIFY to itself this often proves the listener hears (see _Listener._listen)
HEARTBEAT_PREFIX = "heartbeat:"
POLL_S = 1.0  # how long one wait for notifications lasts: the listener sees a stop request this soon
# The listener counts as alive this long after its last confirmed round trip: past it, the cache stands aside.
ALIVE_FOR_S = 3 * HEARTBEAT_S
MAX_AGE_S = 60.0
MAX_ENTRIES = 20_000  # past this, the least recently used go (a cache this size is a few MB)
RECONNECT_MAX_S = 10.0


# Called on the listener thread with the changed table's name, or "" after a reconnect (anything may have changed
# while nobody listened). They must return at once (hand the work to their own thread or event loop).
_subscribers: list[Callable[[str], None]] = []


def subscribe(callback: Callable[[str], None]) -> None:
    """Hear every change notification this process's listener receives (starts the listener where it is on)."""
    if callback not in _subscribers:
        _subscribers.append(callback)
    listener()


def _tell(table: str) -> None:
    for callback in list(_subscribers):
        try:
            callback(table)
        except Exception:
            logger.exception("row cache listener: a subscriber failed on %r", table)


class _Listener:
    """The thread that LISTENs and invalidates. `generation()` is None while the cache must not be used."""

    def __init__(self) -> None:
        # key -> (generation it was read under, row)
        self.entries: TTLCache[Hashable, tuple[int, tuple[Any, ...]]] = TTLCache(ttl_s=MAX_AGE_S, maxsize=MAX_ENTRIES)
        self._generation = 0
        self._alive_at = -1e9  # when the last heartbeat that came back was sent (monotonic)
        self.notifications = 0  # received (tests, diagnostics)
        self.connections = 0  # LISTENing connections made so far
        self.last_payload = ""  # the last notification's payload (the table's name; tests send markers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rowcache-listener", daemon=True)
        self._thread.start()

    def generation(self) -> int | None:
        if time.monotonic() - self._alive_at > ALIVE_FOR_S:
            return None
        return self._generation

    def invalidate(self) -> None:
        self._generation += 1  # first: a lookup racing this stores under the old generation, which no longer counts
        self.entries.clear()

    def stop(self, wait_s: float = POLL_S + 2) -> None:
        self._stop.set()
        self._alive_at = -1e9
        self.invalidate()
        self._thread.join(wait_s)  # its connection closed (a test database can be dropped after this)

    def _connect(self) -> Any:
        import psycopg

        params = connections[DEFAULT_DB_ALIAS].get_connection_params()
        for name in ("cursor_factory", "context", "prepare_threshold"):  # Django's, for its own connections
            params.pop(name, None)
        params["application_name"] = "portal-rowcache"  # recognisable in pg_stat_activity
        return psycopg.connect(**params, autocommit=True)

    def _run(self) -> None:
        backoff = 0.25
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    # Whatever changed while nobody listened: start from nothing.
                    self.invalidate()
                    if self.connections:
                        _tell("")
                    self.connections += 1
                    backoff = 0.25
                    self._listen(conn)
            except Exception as exc:  # any database or network error: stand aside, then reconnect
                self._alive_at = -1e9
                self.invalidate()
                if not self._stop.is_set():
                    logger.warning("row cache listener: %s; lookups go to the database until it reconnects", exc)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _listen(self, conn: Any) -> None:
        """Receive notifications until stopped. Alive = a heartbeat this thread sent through NOTIFY came back:
        not merely a working connection, since behind a pooler in transaction mode (PgBouncer) LISTEN succeeds
        and notifications never arrive. Notifications arrive in commit order, so the heartbeat's return also
        proves that every change committed before it was sent has been seen."""
        sent: dict[str, float] = {}  # heartbeat payload -> monotonic time sent
        beats = 0
        last_sent = -1e9
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_sent >= HEARTBEAT_S:
                beats += 1
                payload = f"{HEARTBEAT_PREFIX}{os.getpid()}:{id(self)}:{beats}"
                conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
                sent[payload] = last_sent = now
                if len(sent) > 8:  # lost ones (the connection hangs): forget the oldest
                    sent.pop(next(iter(sent)))
            for notify in conn.notifies(timeout=POLL_S):
                if notify.payload.startswith(HEARTBEAT_PREFIX):  # a process's heartbeat, not a change
                    at = sent.pop(notify.payload, None)
                    if at is not None:
                        self._alive_at = max(self._alive_at, at)
                    continue
                self.invalidate()
                self.last_payload = notify.payload
                self.notifications += 1
                _tell(notify.payload)


_listener: _Listener | None = None
_lock = threading.Lock()


def enabled() -> bool:
    return bool(getattr(settings, "DB_ROW_CACHE", False))


def listener() -> _Listener | None:
    """This process's listener (started on first use), or None where the cache is off."""
    global _listener
    if _listener is None:
        if not enabled():
            return None
        with _lock:
            if _listener is None:
                _listener = _Listener()
    return _listener


def reset() -> None:
    """Stop this process's listener and forget what it cached (tests)."""
    global _listener
    with _lock:
        if _listener is not None:
            _listener.stop()
        _listener = None


def fetch_one(key: Hashable, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """`rawsql.fetch_one(sql, params)`, served from the cache when it may be. `key` names the row among all
    callers' (e.g. ("token", prefix)); it must determine the row as `sql` and `params` do. Misses (no row) are
    not cached."""
    cache = listener()
    if cache is None or connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return rawsql.fetch_one(sql, params)
    generation = cache.generation()
    if generation is None:
        return rawsql.fetch_one(sql, params)
    entry = cache.entries.get(key)
    if entry is not None and entry[0] == generation:
        return entry[1]
    row = rawsql.fetch_one(sql, params)
    if row is not None:
        cache.entries.set(key, (generation, tuple(row)))
    return row
