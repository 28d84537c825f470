"""Origin checking for websocket handshakes that still admits non-browser clients.

Channels' AllowedHostsOriginValidator refuses a handshake without an `Origin` header, which shuts out the CLI and
scripts that authenticate with `Authorization: Bearer` (docs/api.md: websockets take a session cookie or a bearer
token). The check exists against cross-site websocket hijacking, which needs a browser, and browsers always send
`Origin` on a websocket handshake: so a foreign Origin is refused, a missing one is admitted (such a client has no
ambient cookie to abuse; it must present its own credentials).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import ParseResult

from channels.security.websocket import OriginValidator
from django.conf import settings

logger = logging.getLogger(__name__)


class BrowserOriginValidator(OriginValidator):  # type: ignore[misc]  # Channels ships no types
    """Refuse a handshake whose Origin is not one of ours; admit one with no Origin (not a browser)."""

    def valid_origin(self, parsed_origin: ParseResult | None) -> bool:
        if parsed_origin is None:
            return True
        return bool(self.validate_origin(parsed_origin))


def AllowedHostsOrNoOriginValidator(application: Any) -> BrowserOriginValidator:
    allowed_hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed_hosts)


class DatabaseUnavailableGuard:
    """Websocket counterpart of DatabaseUnavailableMiddleware: when the database is down during the handshake
    (authentication and authorization read it), refuse with HTTP 503 instead of an ASGI exception (uvicorn: 500
    and a traceback in the log); after the handshake, close with 1011 ("unexpected condition")."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from django.db import InterfaceError, OperationalError

        state = {"accepted": False, "closed": False}

        async def tracking_send(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            elif message["type"] in {"websocket.close", "websocket.http.response.start"}:
                state["closed"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("database unavailable during websocket %s: %s", scope.get("path"), exc.__class__.__name__)
            if state["closed"]:
                return
            if state["accepted"]:
                await send({"type": "websocket.close", "code": 1011})
            elif "websocket.http.response" in (scope.get("extensions") or {}):
                body = b'{"code":"unavailable","detail":"The database is unavailable; retry shortly.","fields":{}}'
                await send(
                    {
                        "type": "websocket.http.response.start",
                        "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"5")],
                    }
                )
                await send({"type": "websocket.http.response.body", "body": body})
            else:
                await send({"type": "websocket.close", "code": 1013})  # "try again later"
