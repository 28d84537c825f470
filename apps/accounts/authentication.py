"""`Authorization: Bearer <token>` for the API; sessions (with CSRF) for the browser."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.accounts import tokens
from apps.accounts.models import ApiToken

_LAST_USED_RESOLUTION = timedelta(minutes=1)


def authenticate_token(plaintext: str) -> tuple[AbstractBaseUser, ApiToken]:
    """The user and token for a plaintext personal token; raises AuthenticationFailed with a reason."""
    parsed = tokens.split(plaintext)
    if parsed is None or parsed[0] != tokens.PERSONAL_PREFIX:
        raise exceptions.AuthenticationFailed("Invalid token.")
    token = ApiToken.objects.select_related("user").filter(prefix=parsed[1]).first()
    if token is None or not tokens.matches(plaintext, token.digest):
        raise exceptions.AuthenticationFailed("Invalid token.")
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed("Token has been revoked.", code="token_revoked")
    if token.is_expired:
        raise exceptions.AuthenticationFailed("Token has expired.", code="token_expired")
    if not token.user.is_active:
        raise exceptions.AuthenticationFailed("User is inactive.")
    now = timezone.now()
    # One write a minute at most: a CI loop polling every second must not turn reads into writes.
    if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user, token


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        try:
            plaintext = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        return authenticate_token(plaintext)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class PortalSessionAuthentication(SessionAuthentication):
    """Django sessions with CSRF on unsafe methods (DRF's behaviour), for the browser's fetch() calls."""
