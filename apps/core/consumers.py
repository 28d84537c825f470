"""The base of the portal's websocket consumers: who may watch a stream is decided in `connect()`.

Authentication happened before, in the middleware (session cookie or `Authorization: Bearer`,
apps/accounts/ws_auth.py); a consumer authorizes against the same `visible_to(user)` scoping as the REST API, so a
socket can show nothing its REST twin would refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from apps.accounts.types import User
from apps.core import socket_access
from apps.core.socket_access import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED

logger = logging.getLogger(__name__)

MAX_PING_BYTES: Final = 512

T = TypeVar("T")


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class AuthorizedConsumer(AsyncWebsocketConsumer, ABC, Generic[T]):  # type: ignore[misc]  # Channels is untyped
    """Refuses, with a close code a client can act on, anyone who may not watch what the URL names:

    - 4401: not signed in (no session; an unknown, revoked or expired token) or an inactive account;
    - 4403: a token without `required_scope`;
    - 4404: `authorize()` found nothing this user may see (someone else's object is as absent as a missing one,
      as in the REST API).

    A refusal accepts, then closes: a browser then sees the code (and stops retrying) instead of an opaque 1006.
    Subclasses implement `authorize(user)`, which runs on a worker thread (it may use the ORM) and returns what
    the socket streams or None, and `start(found)`, which joins groups, accepts and sends the first message.

    Once open, the socket checks again when access may have changed (apps/core/socket_access.py) and closes with
    the same codes when it no longer holds; `reauthorized(found)` hears what `authorize` finds then.
    """

    required_scope: str = "read"

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        token = self.scope.get("token")
        if token is not None and not token.has_scope(self.required_scope):
            await self.refuse(CLOSE_FORBIDDEN, reason=f"token lacks the {self.required_scope} scope")
            return
        found = await database_sync_to_async(self.authorize)(user)
        if found is None:
            await self.refuse(CLOSE_NOT_FOUND)
            return
        await self.start(found)
        self._access_watch = asyncio.get_running_loop().create_task(self._recheck_periodically())
        socket_access.register(self)

    # --- access that changes while the socket is open ------------------------------------------------------------

    _access_watch: asyncio.Task[None] | None = None
    _access_ended = False

    async def _recheck_periodically(self) -> None:
        """For what no row change announces (a token or session expiring, a sign-out); changes of users, teams,
        memberships and tokens are checked at once, for all sockets together (socket_access)."""
        while not self._access_ended:
            await asyncio.sleep(socket_access.next_wait_s())
            try:
                (verdict,) = await database_sync_to_async(socket_access.access_now_many)([self])
            except Exception as exc:  # the database away for a moment: the next round checks again
                logger.warning("websocket: could not check %s's access again: %s", self.channel_name, exc)
                continue
            await self.apply_access(*verdict)

    async def apply_access(self, code: int, found: T | None) -> None:
        """The outcome of checking access again: close with `code`, or go on with what `authorize` found now."""
        if self._access_ended:
            return
        if code:
            self._access_ended = True
            socket_access.unregister(self)
            logger.info("websocket: access ended (%s); closing %s", code, self.scope.get("path", ""))
            await self.close(code=code)
        elif found is not None:
            await self.reauthorized(found)

    async def reauthorized(self, found: T) -> None:
        """What `authorize` finds now that access was checked again (the user's teams may have changed)."""

    async def stop_watching_access(self) -> None:
        self._access_ended = True  # a batch check already under way finds it gone
        socket_access.unregister(self)
        if self._access_watch is not None and self._access_watch is not asyncio.current_task():
            self._access_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._access_watch
        self._access_watch = None

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await self.stop_watching_access()
        await super().websocket_disconnect(message)

    @abstractmethod
    def authorize(self, user: User) -> T | None:
        """What this socket streams for `user` (read on a worker thread), or None: not found or not theirs."""

    async def start(self, found: T) -> None:
        await self.accept()

    async def refuse(self, code: int, reason: str | None = None) -> None:
        await self.accept()
        await self.close(code=code, reason=reason)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Clients say nothing on these streams but an occasional {"type": "ping"}; anything else is ignored."""
        if text_data is None or len(text_data) > MAX_PING_BYTES:
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "ping":
            await self.send_json({"type": "pong", "ts": now_iso()})

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content))

    # --- channel-layer groups ---------------------------------------------------------------------------------

    _groups: tuple[str, ...] = ()
    _keeper: asyncio.Task[None] | None = None

    async def join_group(self, group: str) -> None:
        """Join a channel-layer group, and stay in it while the socket is open: channels-redis drops a member
        without a word once it joined longer ago than the layer's `group_expiry` (a day by default), so a page
        left open on a wall would stop hearing its group. Joining again every quarter of that keeps it in."""
        await self.channel_layer.group_add(group, self.channel_name)
        self._groups = (*self._groups, group)
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._stay_joined())

    async def _stay_joined(self) -> None:
        every = max(1.0, float(getattr(self.channel_layer, "group_expiry", 86400)) / 4)
        while True:
            await asyncio.sleep(every)
            for group in self._groups:
                try:
                    await self.channel_layer.group_add(group, self.channel_name)
                except Exception as exc:  # Redis away for a moment: the next round joins again
                    logger.warning(
                        "websocket: could not renew %s's membership of %s: %s", self.channel_name, group, exc
                    )

    async def leave_groups(self) -> None:
        """Leave every group joined (call from `disconnect`)."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        for group in self._groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        self._groups = ()


class NoStreamConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # Channels is untyped
    """Every websocket path no stream has (routed last): accepted, then closed with 4404 like a stream the user may
    not see. Without it Channels' router raises on the unknown path and the handshake fails with HTTP 500."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND, reason="no such stream")
