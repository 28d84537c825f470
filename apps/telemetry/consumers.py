"""Websocket `/ws/fleet/`: one message a second with every GPU the user may see (see apps/telemetry/fanout.py).

Authorized in `connect()` (apps/core/consumers.py: every signed-in user with the read scope may watch; what they
see of holders is decided by their teams); after that it never touches the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Final

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer

from apps.accounts.types import User
from apps.core.consumers import AuthorizedConsumer, now_iso
from apps.telemetry.fanout import Subscriber, Viewer, get_fanout, viewer_for
from portal.internals.channels_send import server_send

CLOSE_TOO_BIG: Final = 1009  # RFC 6455 "message too big"
CLOSE_POLICY: Final = 1008  # RFC 6455 "policy violation"

# A client has nothing to say on this stream but an occasional {"type": "ping"}: refuse anything larger or faster.
MAX_INCOMING_BYTES: Final = 512
MAX_INCOMING_PER_WINDOW: Final = 20
INCOMING_WINDOW_S: Final = 10.0


class FleetConsumer(AuthorizedConsumer[Viewer]):
    """Streams fleet snapshots from the process-wide fan-out; holder details only for the viewer's teams."""

    # No channel-layer channel per socket: snapshots come from the process's own subscription, so a layer
    # channel would only cost a Redis round trip per connect and a receive loop per socket. An alias that is not
    # configured makes Channels skip the layer entirely.
    channel_layer_alias = "fleet-socket-has-no-layer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sub: Subscriber | None = None
        self._pump: asyncio.Task[None] | None = None
        self._window_start = 0.0
        self._window_count = 0

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels (4.2+) runs close_old_connections in a worker thread before every handler. This consumer uses
        # the database only inside connect() through database_sync_to_async, which cleans up after itself, so
        # the extra thread hop per incoming frame is pure cost (bench/fleet_fanout.py --micro measures it).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    def authorize(self, user: User) -> Viewer:
        return viewer_for(user)

    async def start(self, found: Viewer) -> None:
        await self.accept()
        self._attach(found)

    def _attach(self, viewer: Viewer) -> None:
        self._sub = get_fanout().attach(viewer)
        self._pump = asyncio.get_running_loop().create_task(self._send_loop(self._sub))

    async def reauthorized(self, found: Viewer) -> None:
        """The user's teams (or admin rights) changed while watching: from now on, the holders they now see."""
        if self._sub is None or self._sub.viewer == found:
            return
        await self._detach()
        self._attach(found)

    async def _send_loop(self, sub: Subscriber) -> None:
        # One sender per socket: when this client stops reading, only this task waits (the server pauses the
        # transport); the fan-out keeps replacing what is in the mailbox with newer snapshots.
        send = server_send(self.base_send)  # skips the session wrapper (portal/internals/channels_send.py)
        try:
            while True:
                payload = await sub.next()
                await send({"type": "websocket.send", "text": payload})
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: S110 - the client went away mid-send; websocket_disconnect cleans up
            pass

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        now = time.monotonic()
        if now - self._window_start > INCOMING_WINDOW_S:
            self._window_start, self._window_count = now, 0
        self._window_count += 1
        if self._window_count > MAX_INCOMING_PER_WINDOW:
            await self.close(code=CLOSE_POLICY, reason="too many messages")
            return
        if text_data is None or len(text_data) > MAX_INCOMING_BYTES:
            await self.close(code=CLOSE_TOO_BIG if text_data is not None else CLOSE_POLICY)
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "ping":
            await self.send_json({"type": "pong", "ts": now_iso()})

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # The base class ends with another close_old_connections hop; nothing here holds a connection.
        await self.stop_watching_access()
        await self.disconnect(message.get("code", 1000))
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        await self._detach()

    async def _detach(self) -> None:
        if self._sub is not None:
            get_fanout().detach(self._sub)
            self._sub = None
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
