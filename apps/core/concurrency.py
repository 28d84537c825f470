"""Bound the HTTP requests one web process works on at once; the rest wait their turn.

Under ASGI, Django runs each request's synchronous part in a thread of its own, with a database connection of
its own: a burst of 200 concurrent clients means 200 connections from one process, past PostgreSQL's
max_connections (100 by default), and every request beyond it fails with 503 (bench/load_test.py showed 58% of
requests failing at 50 clients). Requests that find every slot taken wait (cheaply, on the event loop) for up to
`wait_s`; only then are they refused with 503 `busy` and Retry-After. The health probe skips the queue, so a
load balancer sees a busy process as alive.
"""

from __future__ import annotations

import asyncio
import json

from apps.core.body_limit import ASGIApp, Receive, Scope, Send

_BUSY = json.dumps(
    {"code": "busy", "detail": "The server is busy; retry shortly.", "fields": {}}, separators=(",", ":")
).encode()
_UNGATED = ("/api/v1/health",)


class ConcurrencyGate:
    """ASGI middleware: at most `limit` HTTP requests inside `app` at once per process (0 = unlimited)."""

    def __init__(self, app: ASGIApp, limit: int | None = None, wait_s: float | None = None) -> None:
        self.app = app
        self._limit = limit
        self._wait_s = wait_s
        self._semaphore: asyncio.Semaphore | None = None

    def _settings(self) -> tuple[int, float]:
        if self._limit is None or self._wait_s is None:
            from django.conf import settings

            self._limit = self._limit if self._limit is not None else int(settings.WEB_MAX_CONCURRENT_REQUESTS)
            self._wait_s = self._wait_s if self._wait_s is not None else float(settings.WEB_QUEUE_WAIT_S)
        return self._limit, self._wait_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, wait_s = self._settings()
        if scope["type"] != "http" or limit <= 0 or scope.get("path", "").startswith(_UNGATED):
            await self.app(scope, receive, send)
            return
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(limit)  # created on the server's event loop
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the acquire in a task of its own, a cost every
            # request paid (~1.8% of a booking request's CPU) even when a slot was free.
            async with asyncio.timeout(wait_s):
                await self._semaphore.acquire()
        except TimeoutError:
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(_BUSY)).encode()),
                        (b"retry-after", b"1"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _BUSY})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._semaphore.release()
