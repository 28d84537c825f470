"""The WSGI-under-ASGI bridge the web process serves HTTP with (portal/internals/wsgi_bridge.py): what the application
sees, what the client gets, one trip to a worker thread for an ordinary response, streaming for the rest."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import FileResponse, HttpResponse, StreamingHttpResponse

from portal.internals.wsgi_bridge import WsgiBridge, build_environ


def _scope(**extra: Any) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/jobs/",
        "root_path": "",
        "query_string": b"state=queued&team=vision",
        "headers": [
            (b"host", b"portal.example"),
            (b"content-type", b"application/json"),
            (b"content-length", b"11"),
            (b"x-forwarded-for", b"10.0.0.1"),
            (b"x-forwarded-for", b"10.0.0.2"),
            (b"authorization", b"Bearer abc"),
        ],
        "client": ("127.0.0.9", 50123),
        "server": ("127.0.0.1", 8000),
    }
    scope.update(extra)
    return scope


def _serve(app: Any, scope: dict[str, Any], body_parts: list[bytes], *, disconnect: bool = False) -> list[dict]:
    """Run one request through the bridge on a fresh event loop; the messages sent, in order."""
    incoming: list[dict[str, Any]] = [
        {"type": "http.request", "body": part, "more_body": i < len(body_parts) - 1}
        for i, part in enumerate(body_parts)
    ]
    if disconnect:
        incoming = [*incoming[:1], {"type": "http.disconnect"}]
        incoming[0]["more_body"] = True
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    bridge = WsgiBridge(app, workers=2)
    try:
        asyncio.run(bridge(scope, receive, send))
    finally:
        bridge.executor.shutdown()
    return sent


def test_environ_follows_pep_3333() -> None:
    environ = build_environ(_scope(root_path="/portal", path="/portal/api/v1/jobs/"), b"hello")
    assert environ["REQUEST_METHOD"] == "POST"
    assert environ["SCRIPT_NAME"] == "/portal"
    assert environ["PATH_INFO"] == "/api/v1/jobs/"
    assert environ["QUERY_STRING"] == "state=queued&team=vision"
    assert environ["CONTENT_TYPE"] == "application/json"
    assert environ["CONTENT_LENGTH"] == "11"
    assert environ["HTTP_HOST"] == "portal.example"
    assert environ["HTTP_AUTHORIZATION"] == "Bearer abc"
    assert environ["HTTP_X_FORWARDED_FOR"] == "10.0.0.1,10.0.0.2"  # repeated headers joined
    assert (environ["REMOTE_ADDR"], environ["REMOTE_PORT"]) == ("127.0.0.9", "50123")
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("127.0.0.1", "8000")
    assert environ["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert environ["wsgi.url_scheme"] == "http"
    assert environ["wsgi.input"].read() == b"hello"
    # A UTF-8 path arrives as WSGI's bytes-as-latin-1 string, which Django decodes back.
    assert build_environ(_scope(path="/ü"), b"")["PATH_INFO"] == "/ü".encode().decode("latin1")


def test_buffered_response_is_one_start_and_one_body_after_the_body_is_read_whole() -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        seen["body"] = environ["wsgi.input"].read()
        seen["thread"] = threading.current_thread().name
        response = HttpResponse(b'{"id": 7}', status=201, content_type="application/json")
        response["X-Request-Id"] = "r-1"
        start_response("201 Created", list(response.items()))
        return response

    sent = _serve(app, _scope(), [b'{"a":', b" 1", b"}"])
    assert seen["body"] == b'{"a": 1}'  # a body sent in three messages reaches the app as one
    assert seen["thread"].startswith("wsgi")  # the app ran on the bridge's pool, not the event loop
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 201
    assert (b"x-request-id", b"r-1") in sent[0]["headers"]
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert sent[1]["body"] == b'{"id": 7}'
    assert not sent[1].get("more_body", False)


def test_close_runs_on_the_worker_thread_after_the_response_is_collected() -> None:
    """Django returns the thread's database connection in response.close(): it must run on that thread."""
    events: list[tuple[str, str]] = []

    class Tracked(HttpResponse):
        def close(self) -> None:
            events.append(("close", threading.current_thread().name))
            super().close()

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        events.append(("app", threading.current_thread().name))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Tracked(b"ok")

    sent = _serve(app, _scope(method="GET"), [b""])
    assert sent[1]["body"] == b"ok"
    assert [e[0] for e in events] == ["app", "close"]
    assert events[0][1] == events[1][1]


def test_a_client_that_leaves_mid_body_is_not_served() -> None:
    called = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        called.append(True)
        start_response("200 OK", [])
        return [b""]

    assert _serve(app, _scope(), [b"part", b"rest"], disconnect=True) == []
    assert called == []


def test_streaming_response_goes_out_while_it_is_produced() -> None:
    """The first chunk reaches the client before the generator has produced the second."""
    first_sent = threading.Event()
    order: list[str] = []

    def chunks() -> Iterator[bytes]:
        yield b"line 1\n"
        # The loop has handed the first chunk to the server before the thread asked for the next one.
        order.append("after first" if first_sent.wait(5) else "timeout")
        yield b""  # an empty chunk is skipped, not sent as an early end
        yield b"line 2\n"

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        response = StreamingHttpResponse(chunks(), content_type="text/plain")
        start_response("200 OK", list(response.items()))
        return response

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        incoming = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message.get("body") == b"line 1\n":
                first_sent.set()

        bridge = WsgiBridge(app, workers=1)
        await bridge(_scope(method="GET"), receive, send)
        bridge.executor.shutdown()

    asyncio.run(run())
    assert order == ["after first"]
    assert [m["type"] for m in sent] == ["http.response.start", *["http.response.body"] * 3]
    assert [m.get("body") for m in sent[1:]] == [b"line 1\n", b"line 2\n", b""]
    assert [m.get("more_body", False) for m in sent[1:]] == [True, True, False]


def test_file_response_arrives_whole_in_large_pieces() -> None:
    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes, read by Django in 4 KiB blocks

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        response = FileResponse(io.BytesIO(data), content_type="application/octet-stream")
        start_response("200 OK", list(response.items()))
        return response

    sent = _serve(app, _scope(method="GET"), [b""])
    bodies = [m["body"] for m in sent[1:]]
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert b"".join(bodies) == data
    assert len(bodies) <= 6  # 256 KiB pieces, not 257 blocks of 4 KiB
    assert sent[-1].get("more_body", False) is False


def test_an_error_in_the_application_reaches_the_server() -> None:
    """Django turns view errors into 500 responses itself; an error below that is the server's to report."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _serve(app, _scope(method="GET"), [b""])


def test_only_http_is_served() -> None:
    async def run() -> None:
        bridge = WsgiBridge(lambda e, s: [b""], workers=1)

        async def receive() -> dict[str, Any]:
            return {}

        async def send(message: dict[str, Any]) -> None:
            pass

        await bridge({"type": "websocket"}, receive, send)

    with pytest.raises(ValueError, match="HTTP only"):
        asyncio.run(run())
