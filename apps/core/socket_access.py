"""Open websockets keep only the access they still have.

A socket is authorized once, when it connects (apps/core/consumers.py). Without more, a user taken out of a team
would go on hearing that team's job logs and costs until the page closed, a revoked token's script would go on
streaming, and a page's idea of "my team's bookings" would stay as it was. So each open socket checks again:

- at once, when a user, a team, a membership or a token changes: the web process already hears every such change
  from PostgreSQL (the row cache's LISTEN, apps/core/rowcache.py; the triggers also see the admin's and directory
  sync's changes and an administrator's SQL); and when someone signs out (`signed_out` notifies the same way); a
  burst of changes is one check;
- and every `WS_ACCESS_RECHECK_S` (5 minutes by default, spread out), for what no row change announces: a token
  or a session that expires, and a process whose row cache is off (`DB_ROW_CACHE=0`).

A check reads the user, the token or the session and `authorize()` again, as on connect, and says how the socket
must close when it fails (4401: signed out, deactivated, token revoked or expired; 4403: the token lost the scope;
4404: no longer the user's to see), or what it now streams. After a change, all the sockets of an event loop are
checked in one batch, on one database connection (bench/socket_access.py measures it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

from django.conf import settings

from apps.core import rowcache

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED: Final = 4401
CLOSE_FORBIDDEN: Final = 4403
CLOSE_NOT_FOUND: Final = 4404
# The tables whose rows decide who may watch what (the row cache's triggers notify with the table's name).
ACCESS_TABLES: Final = frozenset(
    {"auth_user", "accounts_team", "accounts_membership", "accounts_apitoken", "django_session"}
)
SETTLE_S: Final = 0.2  # a burst of changes (a directory sync's memberships) is checked once, this long after
TOKENS: Final = "accounts_apitoken"
SESSIONS: Final = "django_session"  # no trigger: sent on signing out (`signed_out`)


class Socket(Protocol):
    """What this module needs of an open socket (apps.core.consumers.AuthorizedConsumer)."""

    scope: dict[str, Any]
    required_scope: str

    def authorize(self, user: Any) -> Any: ...

    async def apply_access(self, code: int, found: Any) -> None: ...


_lock = threading.Lock()
_open: dict[Socket, asyncio.AbstractEventLoop] = {}
_pending: dict[asyncio.AbstractEventLoop, set[str]] = {}  # loop -> tables changed since its check was scheduled
_batches: set[asyncio.Task[None]] = set()  # the running checks (a reference keeps each task alive)


def recheck_every_s() -> float:
    return max(1.0, float(getattr(settings, "WS_ACCESS_RECHECK_S", 300)))


def register(socket: Socket) -> None:
    """Follow access changes for an accepted socket (from its event loop)."""
    with _lock:
        _open[socket] = asyncio.get_running_loop()
    rowcache.subscribe(_changed)  # once per process; starts the listener where the row cache is on


def unregister(socket: Socket) -> None:
    with _lock:
        _open.pop(socket, None)


def _changed(table: str) -> None:
    """On the row cache's listener thread: have each event loop with open sockets check them again, once for a
    burst of changes."""
    if table and table not in ACCESS_TABLES:
        return
    with _lock:
        loops = set(_open.values())
        fresh = [loop for loop in loops if loop not in _pending]
        for loop in loops:
            _pending.setdefault(loop, set()).add(table)
    for loop in fresh:
        try:
            loop.call_soon_threadsafe(_start_batch, loop)
        except RuntimeError:  # its loop has closed: the process is stopping
            with _lock:
                _pending.pop(loop, None)


def _start_batch(loop: asyncio.AbstractEventLoop) -> None:
    task = loop.create_task(_check_loop(loop))
    _batches.add(task)
    task.add_done_callback(_batches.discard)


async def _check_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Check every socket of this loop again, in one trip to a worker thread and one database connection (a
    web process may hold thousands of sockets: one check each would open as many connections)."""
    from channels.db import database_sync_to_async

    await asyncio.sleep(SETTLE_S)
    with _lock:
        tables = _pending.pop(loop, set())
        sockets = [s for s, at in _open.items() if at is loop]
    if not tables - {TOKENS}:  # only tokens changed: a socket signed in by its session holds none
        sockets = [s for s in sockets if s.scope.get("token") is not None]
    elif not tables - {SESSIONS}:  # only a sign-out: a socket signed in by a token is not affected
        sockets = [s for s in sockets if s.scope.get("token") is None]
    if not sockets:
        return
    try:
        verdicts = await database_sync_to_async(access_now_many)(sockets)
    except Exception as exc:  # the database away for a moment: each socket's periodic check tries again
        logger.warning("websocket: could not check %d sockets' access again: %s", len(sockets), exc)
        return
    for socket, (code, found) in zip(sockets, verdicts, strict=True):
        try:
            await socket.apply_access(code, found)
        except Exception:  # one socket failing to close must not keep the others open
            logger.exception("websocket: applying an access check failed")


def signed_out(sender: Any = None, **kwargs: Any) -> None:
    """Django's `user_logged_out` signal: the session is gone, so that browser's other open pages must stop
    streaming. Sessions have no trigger (every request may write one), so the sign-out notifies through the same
    channel itself; every web process checks its session-signed sockets again."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [rowcache.CHANNEL, SESSIONS])


def next_wait_s() -> float:
    """How long a socket waits for its next periodic check: spread out, so sockets opened together (a web
    process's restart reconnects every page) do not all check at once."""
    return recheck_every_s() * random.uniform(0.75, 1.25)  # spreading load, not a secret


def access_now_many(sockets: Sequence[Socket]) -> list[tuple[int, Any]]:
    """For each socket, (close code, None) when it may no longer stream, or (0, what authorize() now finds) when it
    may. Users and tokens are read once for all (one user object per user, so what `authorize` caches on it, such
    as the user's team ids, is read once too). Reads the database: call on a worker thread."""
    from django.contrib.auth import get_user_model

    from apps.accounts.models import ApiToken

    user_ids = {pk for s in sockets if (pk := getattr(s.scope.get("user"), "pk", None)) is not None}
    users = {u.pk: u for u in get_user_model().objects.filter(pk__in=user_ids, is_active=True)}
    token_ids = {t.pk for s in sockets if (t := s.scope.get("token")) is not None}
    tokens = {t.pk: t for t in ApiToken.objects.active().filter(pk__in=token_ids)} if token_ids else {}
    return [_verdict(s, users, tokens) for s in sockets]


def _verdict(socket: Socket, users: dict[Any, Any], tokens: dict[Any, Any]) -> tuple[int, Any]:
    user = users.get(getattr(socket.scope.get("user"), "pk", None))
    if user is None:  # deleted or deactivated
        return CLOSE_UNAUTHENTICATED, None
    token = socket.scope.get("token")
    if token is not None:
        fresh = tokens.get(token.pk)
        if fresh is None or fresh.user_id != user.pk:  # revoked, expired or deleted
            return CLOSE_UNAUTHENTICATED, None
        if not fresh.has_scope(socket.required_scope):
            return CLOSE_FORBIDDEN, None
    elif not _session_still_signs_in(socket.scope, user):
        return CLOSE_UNAUTHENTICATED, None
    found = socket.authorize(user)
    return (CLOSE_NOT_FOUND, None) if found is None else (0, found)


def _session_still_signs_in(scope: dict[str, Any], user: Any) -> bool:
    """Whether the socket's session still signs this user in, as Django's `get_user` decides for a request: the
    session exists (not signed out, not expired) and its password hash matches (a password change signs out)."""
    from importlib import import_module

    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
    from django.utils.crypto import constant_time_compare

    session = scope.get("session")
    key = getattr(session, "session_key", None)
    if not key:
        return False
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    held = str(data.get(HASH_SESSION_KEY, ""))
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]  # SECRET_KEY_FALLBACKS
    return any(constant_time_compare(held, h) for h in hashes)
