"""Websocket authentication: the session cookie (browsers) or `Authorization: Bearer` (CLI, scripts).

Consumers then authorize in `connect()` against `visible_to(user)` like any API view.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from apps.accounts.models import ApiToken

# Channels ships no type information: its middleware base class is untyped, hence the ignore below.


def _user_for_token(plaintext: str) -> tuple[AbstractBaseUser | AnonymousUser, ApiToken | None]:
    from rest_framework.exceptions import AuthenticationFailed

    from apps.accounts.authentication import authenticate_token

    try:
        return authenticate_token(plaintext)
    except AuthenticationFailed:
        return AnonymousUser(), None


class _BearerOrSessionAuth(AuthMiddleware):  # type: ignore[misc]
    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode(errors="replace").split()
        if len(auth) == 2 and auth[0].lower() == "bearer":
            user, token = await database_sync_to_async(_user_for_token)(auth[1])
            scope["user"]._wrapped = user
            scope["token"] = token
            return
        scope["token"] = None
        await super().resolve_scope(scope)


def PortalWebsocketAuthMiddleware(inner: Any) -> Any:
    return CookieMiddleware(SessionMiddleware(_BearerOrSessionAuth(inner)))
