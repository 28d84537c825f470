"""Open websockets keep only the access they still have.

A socket is authorized once, when it connects (apps/core/consumers.py). Without more, a user taken out of a team
would go on hearing that team's job logs and costs until the page closed, a revoked token's script would go on
streaming, and a page's idea of "my team's bookings" would stay as it was. So each open socket checks again:

- at once, when a user, a team, a membership or a token changes: the web process already hears every such change
  from PostgreSQL (the row cache's LISTEN, apps/core/rowcache.py; the triggers also see the admin's and directory
  sync's changes and an administrator's SQL); a burst of changes is one check;
- and every `WS_ACCESS_RECHECK_S` (5 minutes by default, spread out), for what no row change announces: a token
  or a session that expires, a sign-out elsewhere, and a process whose row cache is off (`DB_ROW_CACHE=0`).

A check reads the user, the token or the session and `authorize()` again, as on connect; `access_now()` says how
the socket must close when it fails (4401: signed out, deactivated, token revoked or expired; 4403: the token
lost the scope; 4404: no longer the user's to see), or what it now streams.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any, Final, Protocol

from django.conf import settings

from apps.core import rowcache

CLOSE_UNAUTHENTICATED: Final = 4401
CLOSE_FORBIDDEN: Final = 4403
CLOSE_NOT_FOUND: Final = 4404
# The tables whose rows decide who may watch what (the row cache's triggers notify with the table's name).
ACCESS_TABLES: Final = frozenset({"auth_user", "accounts_team", "accounts_membership", "accounts_apitoken"})
SETTLE_S: Final = 0.2  # a burst of changes (a directory sync's memberships) is checked once, this long after



class Socket(Protocol):
    """What this module needs of an open socket (apps.core.consumers.AuthorizedConsumer)."""

    scope: dict[str, Any]
    required_scope: str

    def authorize(self, user: Any) -> Any: ...

    def access_may_have_changed(self) -> None: ...


_lock = threading.Lock()
_open: dict[Socket, asyncio.AbstractEventLoop] = {}


def recheck_every_s() -> float:
    return max(1.0, float(getattr(settings, "WS_ACCESS_RECHECK_S", 300)))


def register(consumer: Socket) -> None:
    """Follow access changes for an accepted socket (from its event loop)."""
    with _lock:
        _open[consumer] = asyncio.get_running_loop()
    rowcache.subscribe(_changed)  # once per process; starts the listener where the row cache is on


def unregister(consumer: Socket) -> None:
    with _lock:
        _open.pop(consumer, None)


def _changed(table: str) -> None:
    """On the row cache's listener thread: wake every open socket of the process when access may have changed."""
    if table and table not in ACCESS_TABLES:
        return
    with _lock:
        targets = list(_open.items())
    for consumer, loop in targets:
        try:
            loop.call_soon_threadsafe(consumer.access_may_have_changed)
        except RuntimeError:  # its loop has closed: the process is stopping
            pass


def next_wait_s() -> float:
    """How long a socket waits for its next periodic check: spread out, so sockets opened together (a web
    process's restart reconnects every page) do not all check at once."""
    return recheck_every_s() * random.uniform(0.75, 1.25)  # spreading load, not a secret


def access_now(consumer: Socket) -> tuple[int, Any]:
    """(close code, None) when the socket may no longer stream; (0, what authorize() now finds) when it may.
    Reads the database: call on a worker thread."""
    from django.contrib.auth import get_user_model

    from apps.accounts.models import ApiToken

    scope = consumer.scope
    user_id = getattr(scope.get("user"), "pk", None)
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first() if user_id is not None else None
    if user is None:
        return CLOSE_UNAUTHENTICATED, None
    token = scope.get("token")
    if token is not None:
        fresh = ApiToken.objects.active().filter(pk=token.pk, user_id=user.pk).first()
        if fresh is None:
            return CLOSE_UNAUTHENTICATED, None
        if not fresh.has_scope(consumer.required_scope):
            return CLOSE_FORBIDDEN, None
    elif not _session_still_signs_in(scope, user):
        return CLOSE_UNAUTHENTICATED, None
    found = consumer.authorize(user)
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
