"""Cap the request body at the ASGI edge, before Django reads it.

Django's DATA_UPLOAD_MAX_MEMORY_SIZE is checked against Content-Length when a view reads the body, but Django's
ASGI handler first spools the *whole* body (to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE): a chunked
upload without Content-Length can fill the disk, and DRF then ignores such a body altogether (it parses nothing
without Content-Length). This wrapper answers 413 in the error shape as soon as a body is known to be too large
(declared, or counted while a chunked body streams in), and gives a chunked body that fits a Content-Length so
the API parses it like any other.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]  # Django's handler types receive/send with Mapping

_BODY = json.dumps(
    {"code": "payload_too_large", "detail": "The request body is too large.", "fields": {}}, separators=(",", ":")
).encode()


async def _refuse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_BODY)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _BODY})


class BodySizeLimit:
    """ASGI middleware: HTTP request bodies over `max_bytes` get 413 without reaching the application."""

    def __init__(self, app: ASGIApp, max_bytes: int | None = None) -> None:
        self.app = app
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        if self._max_bytes is None:
            from django.conf import settings

            self._max_bytes = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0) or 2**62
        return self._max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        declared = next((value for name, value in headers if name == b"content-length"), None)
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                too_big = False  # the server refuses a malformed Content-Length itself
            if too_big:
                await _refuse(send)
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") in {"GET", "HEAD", "OPTIONS", "DELETE"} and not any(
            name == b"transfer-encoding" for name, _ in headers
        ):
            await self.app(scope, receive, send)
            return

        # A streamed body: read it here, counting, then hand it on whole with its length.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        new_headers = [(n, v) for n, v in headers if n != b"transfer-encoding"]
        new_headers.append((b"content-length", str(len(body)).encode()))
        await self.app({**scope, "headers": new_headers}, replay, send)
