"""An ASGI app whose websocket handler never returns, not even after the socket closes: what a Channels consumer
blocked in the channel layer's receive looks like to uvicorn (tests/core/test_serve.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def app(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await asyncio.Event().wait()  # never reads websocket.disconnect: only a cancellation ends it
