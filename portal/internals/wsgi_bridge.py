"""Serve a WSGI application (Django's WSGI handler) under ASGI HTTP, with one trip to a worker thread per request.

Why: every view is synchronous. Django's ASGI handler runs each request's sync part on a thread of a per-request
executor and adapts the middleware chain between sync and async on the way; asgiref's WsgiToAsgi runs every
request on one shared thread (thread-sensitive sync_to_async), so one request waiting on a lock holds up all the
others, and hands each response message back to the loop separately. Here the loop reads the body first
(BodySizeLimit in front bounds it), a thread of a fixed pool runs the application and, for an ordinary response,
collects status, headers and body, and the loop sends them: one crossing in, one out (bench/internals_web.py
measures it against both). A streaming response (Django's `streaming` responses, or any iterable that is not a
list) still goes out chunk by chunk as the application produces it, each chunk handed to the loop.

The application's iterable is iterated and closed on the worker thread, as a WSGI server does: Django's
`request_finished` signal (which returns the thread's database connection) runs in `close()`.

Upstream names it relies on (README.md): PEP 3333 and the ASGI HTTP spec, plus two attributes of Django's
responses: `HttpResponseBase.streaming` and `FileResponse.file_to_stream`. `tests/core/test_wsgi_bridge.py`.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import sys
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from apps.core.body_limit import Message, Receive, Scope, Send

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], None]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_FILE_PIECE = 256 * 1024
_HEADER_NAMES: dict[bytes, str] = {b"content-length": "CONTENT_LENGTH", b"content-type": "CONTENT_TYPE"}


def build_environ(scope: Scope, body: bytes) -> Environ:
    """The WSGI environ of an ASGI HTTP scope (PEP 3333; headers repeated in the request are joined by commas)."""
    script_name = scope.get("root_path", "").encode("utf8").decode("latin1")
    path_info = scope["path"].encode("utf8").decode("latin1")
    if script_name and path_info.startswith(script_name):
        path_info = path_info[len(script_name) :]
    server = scope.get("server") or ("localhost", 80)
    environ: Environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path_info,
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 0),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    client = scope.get("client")
    if client:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = str(client[0]), str(client[1])
    for raw_name, raw_value in scope.get("headers", ()):
        key = _HEADER_NAMES.get(raw_name)
        if key is None:
            key = "HTTP_" + raw_name.decode("latin1").upper().replace("-", "_")
        value = raw_value.decode("latin1")
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


class _Exchange:
    """One request's response as the application builds it on the worker thread."""

    __slots__ = ("chunks", "headers", "loop", "send", "started", "status")

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Send) -> None:
        self.loop = loop
        self.send = send
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.started = False  # the response start went out (streaming)

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
        if exc_info is not None and self.started:
            raise exc_info[1].with_traceback(exc_info[2])  # PEP 3333: too late to change the status
        self.status = int(status.split(" ", 1)[0])
        self.headers = [(name.lower().encode("latin1"), value.encode("latin1")) for name, value in headers]
        return self.write

    def write(self, chunk: bytes) -> None:
        """The legacy `write` callable: kept in order with what the iterable yields."""
        if self.started:
            self.hand_over({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            self.chunks.append(chunk)

    def hand_over(self, message: Message) -> None:
        """Send one message from the worker thread, waiting until the loop has taken it (back-pressure)."""
        asyncio.run_coroutine_threadsafe(cast(Coroutine[Any, Any, None], self.send(message)), self.loop).result()

    def start_streaming(self) -> None:
        self.started = True
        self.hand_over({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for chunk in self.chunks:
            self.hand_over({"type": "http.response.body", "body": chunk, "more_body": True})
        self.chunks = []


def _buffered(iterable: Iterable[bytes]) -> bool:
    """Whether the response is complete in memory (so it is sent in one piece)."""
    if isinstance(iterable, list | tuple):
        return True
    streaming = getattr(iterable, "streaming", None)  # Django's HttpResponse / StreamingHttpResponse
    return streaming is False


class WsgiBridge:
    """ASGI application serving `app` on a pool of `workers` long-lived threads (HTTP only)."""

    def __init__(self, app: WSGIApp, *, workers: int) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wsgi")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"WsgiBridge serves HTTP only, not {scope['type']!r}")
        parts: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its whole request: nothing to answer
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        environ = build_environ(scope, parts[0] if len(parts) == 1 else b"".join(parts))
        loop = asyncio.get_running_loop()
        exchange = _Exchange(loop, send)
        context = contextvars.copy_context()
        complete = await loop.run_in_executor(self.executor, context.run, self._run, environ, exchange)
        if complete:
            body = b"".join(exchange.chunks)
            await send({"type": "http.response.start", "status": exchange.status, "headers": exchange.headers})
            await send({"type": "http.response.body", "body": body})

    def _run(self, environ: Environ, exchange: _Exchange) -> bool:
        """On a worker thread: run the application. True when the response is left for the loop to send whole;
        False when it was streamed from here."""
        iterable = self.app(environ, exchange.start_response)
        try:
            if _buffered(iterable):
                exchange.chunks.extend(iterable)
                return True
            # A file (Django's FileResponse, WhiteNoise's static files) comes in 4 KiB blocks that are all ready at
            # once: handed over in larger pieces. Anything else goes out as produced (it may be waiting on events).
            piece = _FILE_PIECE if getattr(iterable, "file_to_stream", None) is not None else 0
            pending: list[bytes] = []
            size = 0
            for chunk in iterable:
                if not exchange.started:
                    exchange.start_streaming()  # after the first chunk: a generator may call start_response late
                if not chunk:
                    continue
                pending.append(chunk)
                size += len(chunk)
                if size >= piece:
                    exchange.hand_over({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                    pending, size = [], 0
            if not exchange.started:
                exchange.start_streaming()
            exchange.hand_over({"type": "http.response.body", "body": b"".join(pending)})
            return False
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
