"""The ASGI wrappers in front of Django, in-process: body size cap and Origin check (no server, no database)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlparse

import pytest

from apps.core.body_limit import BodySizeLimit
from apps.core.websocket import BrowserOriginValidator


class Recorder:
    """An inner ASGI app that reads the whole body and answers 200, remembering what it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls.append((scope, body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(app: Any, scope: dict[str, Any], chunks: list[bytes]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "path": "/api/v1/tokens/", **scope}, receive, send))
    return sent


def test_declared_oversized_body_is_refused_unread() -> None:
    inner = Recorder()
    sent = _run(
        BodySizeLimit(inner, max_bytes=100),
        {"method": "POST", "headers": [(b"content-length", b"101")]},
        [b"x" * 101],
    )
    assert sent[0]["status"] == 413 and not inner.calls
    assert json.loads(sent[1]["body"])["code"] == "payload_too_large"


def test_streamed_oversized_body_is_refused_while_counting() -> None:
    inner = Recorder()
    sent = _run(
        BodySizeLimit(inner, max_bytes=100),
        {"method": "POST", "headers": [(b"transfer-encoding", b"chunked")]},
        [b"x" * 60, b"x" * 60, b"x" * 60],
    )
    assert sent[0]["status"] == 413 and not inner.calls


def test_streamed_body_that_fits_reaches_the_app_whole_with_a_length() -> None:
    inner = Recorder()
    sent = _run(
        BodySizeLimit(inner, max_bytes=100),
        {"method": "POST", "headers": [(b"transfer-encoding", b"chunked")]},
        [b'{"a":', b" 1}"],
    )
    assert sent[0]["status"] == 200
    scope, body = inner.calls[0]
    assert body == b'{"a": 1}'
    assert (b"content-length", b"8") in scope["headers"]
    assert not any(name == b"transfer-encoding" for name, _ in scope["headers"])


def test_bodies_within_the_declared_limit_and_gets_pass_through() -> None:
    inner = Recorder()
    limit = BodySizeLimit(inner, max_bytes=100)
    assert _run(limit, {"method": "POST", "headers": [(b"content-length", b"5")]}, [b"hello"])[0]["status"] == 200
    assert _run(limit, {"method": "GET", "headers": []}, [b""])[0]["status"] == 200
    assert [body for _, body in inner.calls] == [b"hello", b""]


def test_origin_check_admits_no_origin_and_own_hosts_only() -> None:
    validator = BrowserOriginValidator(None, ["portal.example.org", "127.0.0.1"])
    assert validator.valid_origin(None)  # CLI and scripts: no Origin, their own credentials
    assert validator.valid_origin(urlparse("https://portal.example.org"))
    assert validator.valid_origin(urlparse("http://127.0.0.1:8000"))
    assert not validator.valid_origin(urlparse("https://evil.example"))
    assert not validator.valid_origin(urlparse("https://portal.example.org.evil.example"))


@pytest.mark.django_db
def test_django_level_refusals_under_api_are_in_the_error_shape(settings: Any, client: Any) -> None:
    """A Host that is not ours is refused by Django before DRF: production answers in the error shape too."""
    settings.DEBUG = False
    resp = client.get("/api/v1/me", HTTP_HOST="evil.example")
    assert resp.status_code == 400
    assert resp.json() == {"code": "bad_request", "detail": "Bad request.", "fields": {}}
    page = client.get("/", HTTP_HOST="evil.example")
    assert page.status_code == 400 and "Traceback" not in page.content.decode()


@pytest.mark.django_db
def test_session_writes_to_the_api_need_the_csrf_token(bob: Any) -> None:
    """A signed-in browser's cookie alone cannot write through the API (cross-site request forgery)."""
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(bob)
    body = json.dumps({"name": "forged", "scopes": ["read"]})
    forged = browser.post("/api/v1/tokens/", body, content_type="application/json")
    assert forged.status_code == 403
    assert forged.json()["code"] == "forbidden"
    assert browser.get("/api/v1/me").status_code == 200  # reads need no token
    browser.get("/accounts/settings/")  # any page sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    made = browser.post("/api/v1/tokens/", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert made.status_code == 201, made.content[:200]
