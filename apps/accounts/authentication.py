"""`Authorization: Bearer <token>` for the API; sessions (with CSRF) for the browser."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from rest_framework import HTTP_HEADER_ENCODING, exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.request import Request

from apps.accounts import tokens
from apps.accounts.models import ApiToken
from apps.core import rawsql, rowcache
from apps.core.ttlcache import TTLCache

_LAST_USED_RESOLUTION = timedelta(minutes=1)
# When this process last wrote a token's last_used_at (token pk -> time), for the last minute: a cached token row
# keeps the value it was read with, so without this every request after the first minute would write it again.
_last_used_written: TTLCache[int, datetime] = TTLCache(ttl_s=_LAST_USED_RESOLUTION.total_seconds(), maxsize=100_000)


def _token_with_user(prefix: str) -> ApiToken | None:
    """The token with this prefix and its user, in one hand-written query: every API request makes it, and the
    ORM spent more CPU compiling it than PostgreSQL running it (apps/core/rawsql.py). Served from the web
    process's row cache where it may be (apps/core/rowcache.py); the caller still checks digest, revocation,
    expiry and the user's state on every request."""
    user_model = get_user_model()
    tok, usr = rawsql.columns(ApiToken, "t"), rawsql.columns(user_model, "u")
    # Table and column names from the models' metadata; the prefix is a parameter.
    sql = f"SELECT {tok.sql}, {usr.sql} FROM {ApiToken._meta.db_table} t JOIN {user_model._meta.db_table} u "  # noqa: S608
    sql += f"ON u.{user_model._meta.pk.column} = t.user_id WHERE t.prefix = %s"
    row = rowcache.fetch_one(("token", prefix), sql, [prefix])
    if row is None:
        return None
    token: ApiToken = tok.load(row)
    token.user = usr.load(row, tok.width)
    return token


def authenticate_token(plaintext: str) -> tuple[AbstractBaseUser, ApiToken]:
    """The user and token for a plaintext personal token; raises AuthenticationFailed with a reason."""
    parsed = tokens.split(plaintext)
    if parsed is None or parsed[0] != tokens.PERSONAL_PREFIX:
        raise exceptions.AuthenticationFailed("Invalid token.")
    token = _token_with_user(parsed[1])
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
    last_used = max(filter(None, (token.last_used_at, _last_used_written.get(token.pk))), default=None)
    if last_used is None or now - last_used > _LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        _last_used_written.set(token.pk, now)
    return token.user, token


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        # META, not DRF's get_authorization_header: that reads request.headers, which builds a dict of every
        # header of the request (~3% of a booking request's CPU) to return one of them.
        raw = request.META.get("HTTP_AUTHORIZATION", b"")
        header = (raw.encode(HTTP_HEADER_ENCODING) if isinstance(raw, str) else raw).split()
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
