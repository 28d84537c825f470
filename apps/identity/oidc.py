"""OpenID Connect sign-in through mozilla-django-oidc, configured from the issuer's discovery document.

The library's backend and views read `OIDC_OP_*` / `OIDC_RP_*` settings; `oidc_setting` answers those from the
portal's own settings (`OIDC_ISSUER_URL`, `OIDC_CLIENT_ID`, ...) and the discovery document, which is fetched on
first use and kept for the life of the process (only a successful, consistent one is kept).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from apps.accounts.types import User
from apps.identity import services
from apps.identity.models import UnixAccountSource


class OIDCConfigurationError(Exception):
    """The provider cannot be used: not configured, unreachable, or its discovery document is inconsistent."""


@dataclass(frozen=True)
class Discovery:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None = None  # OpenID Connect RP-Initiated Logout 1.0; absent at many providers


def _normalized(url: str) -> str:
    return url.rstrip("/")


@functools.cache
def _discover(issuer_url: str) -> Discovery:
    """The discovery document of `issuer_url`. Cached per URL; a failure raises and is not cached."""
    url = _normalized(issuer_url) + "/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT_S)
        response.raise_for_status()
        doc = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise OIDCConfigurationError(f"The sign-in provider's discovery document ({url}) could not be read.") from exc
    # OpenID Connect Discovery 1.0 §4.3: the issuer in the document must be the one we asked.
    if not isinstance(doc, dict) or _normalized(str(doc.get("issuer", ""))) != _normalized(issuer_url):
        raise OIDCConfigurationError(
            f"The discovery document at {url} names a different issuer ({doc.get('issuer')!r})."
        )
    try:
        return Discovery(
            issuer=str(doc["issuer"]),
            authorization_endpoint=str(doc["authorization_endpoint"]),
            token_endpoint=str(doc["token_endpoint"]),
            userinfo_endpoint=str(doc["userinfo_endpoint"]),
            jwks_uri=str(doc["jwks_uri"]),
            end_session_endpoint=_optional_url(doc.get("end_session_endpoint")),
        )
    except KeyError as exc:
        raise OIDCConfigurationError(f"The discovery document at {url} lacks {exc.args[0]!r}.") from exc


def _optional_url(value: object) -> str | None:
    """An optional endpoint of the discovery document: a http(s) URL, or None when absent or not a URL."""
    return value if isinstance(value, str) and value.startswith(("https://", "http://")) else None


def provider_sign_out_url(*, id_token: str, return_to: str) -> str | None:
    """Where to send the browser so that the provider ends its session too (RP-Initiated Logout 1.0): its
    `end_session_endpoint` with the ID token as `id_token_hint` and `return_to` as `post_logout_redirect_uri` (which
    the provider's admin must have registered for the client). None when the provider has no such endpoint or
    cannot be reached: signing out of the portal never waits on the provider."""
    try:
        endpoint = discovery().end_session_endpoint
    except OIDCConfigurationError:
        return None
    if not endpoint:
        return None
    query = urlencode(
        {"id_token_hint": id_token, "client_id": settings.OIDC_CLIENT_ID, "post_logout_redirect_uri": return_to}
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def oidc_enabled() -> bool:
    return bool(settings.OIDC_ISSUER_URL and settings.OIDC_CLIENT_ID)


def discovery() -> Discovery:
    if not oidc_enabled():
        raise OIDCConfigurationError("Single sign-on is not configured (OIDC_ISSUER_URL, OIDC_CLIENT_ID).")
    return _discover(settings.OIDC_ISSUER_URL)


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's setting names, answered from the portal's settings and the discovery document."""
    if attr.startswith("OIDC_OP_"):
        doc = discovery()
        endpoints = {
            "OIDC_OP_AUTHORIZATION_ENDPOINT": doc.authorization_endpoint,
            "OIDC_OP_TOKEN_ENDPOINT": doc.token_endpoint,
            "OIDC_OP_USER_ENDPOINT": doc.userinfo_endpoint,
            "OIDC_OP_JWKS_ENDPOINT": doc.jwks_uri,
        }
        if attr in endpoints:
            return endpoints[attr]
        return default[0] if default else None
    mapped: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": settings.OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.OIDC_CLIENT_SECRET,
        "OIDC_RP_SIGN_ALGO": settings.OIDC_SIGN_ALGO,
        "OIDC_RP_SCOPES": settings.OIDC_SCOPES,
        "OIDC_TIMEOUT": settings.OIDC_TIMEOUT_S,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_CREATE_USER": True,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "identity:oidc-callback",
        "OIDC_REDIRECT_FIELD_NAME": "next",
        # Kept in the (server-side) session for the provider's sign-out: it names the session to end there.
        "OIDC_STORE_ID_TOKEN": True,
    }
    if attr in mapped:
        return mapped[attr]
    return import_from_settings(attr, *default)


class PortalOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """The authorization code flow's backend: verifies the ID token fully, then signs the subject in and syncs
    their teams from the groups claim.

    Checks beyond the library's: the token's issuer is the configured one, its audience is our client id, it has
    not expired (PyJWT raises for `exp`; the library lets that escape), and userinfo describes the same subject."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Nothing is read here: Django builds every backend for each password sign-in too, and a local sign-in must
        # not depend on the provider being configured or reachable.
        self.UserModel = User

    def _load(self) -> None:
        doc = discovery()
        self.issuer = doc.issuer
        self.OIDC_OP_TOKEN_ENDPOINT = doc.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = doc.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = doc.jwks_uri
        self.OIDC_RP_CLIENT_ID = settings.OIDC_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        if request is None or not (request.GET.get("code") and request.GET.get("state")) or not oidc_enabled():
            return None
        self._load()
        user: User | None = super().authenticate(request, **kwargs)
        return user

    def retrieve_matching_jwk(self, token: bytes | str) -> jwt.PyJWK:
        """The provider's signing key for this token: the one with the token's `kid`, or, for a token without one
        (allowed when a provider publishes a single key), the only key for its algorithm."""
        response = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=settings.OIDC_TIMEOUT_S)
        response.raise_for_status()
        try:
            keys = [k for k in response.json().get("keys", []) if isinstance(k, dict)]
            header = jwt.get_unverified_header(token)
        except (ValueError, AttributeError, jwt.InvalidTokenError) as exc:
            raise SuspiciousOperation("The provider's keys or the ID token's header could not be read.") from exc
        kid = header.get("kid")
        candidates = [
            k
            for k in keys
            if (kid is None or k.get("kid") == kid)
            and k.get("alg", header.get("alg")) == header.get("alg")
            and k.get("use", "sig") == "sig"
        ]
        if len(candidates) != 1:
            raise SuspiciousOperation("No single signing key of the provider matches the ID token.")
        return jwt.PyJWK(candidates[0])

    def _verify_jws(self, payload: bytes | str, key: Any) -> dict[str, Any]:
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(
                f"The ID token is signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}."
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=self.issuer,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
                leeway=settings.OIDC_CLOCK_SKEW_S,
            )
        except jwt.ExpiredSignatureError as exc:
            raise SuspiciousOperation("The ID token has expired.") from exc
        except jwt.InvalidIssuerError as exc:
            raise SuspiciousOperation("The ID token comes from an unknown issuer.") from exc
        except jwt.InvalidAudienceError as exc:
            raise SuspiciousOperation("The ID token was issued for another client.") from exc
        except jwt.InvalidSignatureError as exc:
            raise SuspiciousOperation("The ID token's signature does not verify.") from exc
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"The ID token is not valid: {exc}.") from exc
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = super().get_userinfo(access_token, id_token, payload)
        # OpenID Connect Core §5.3.2: userinfo's sub must be the ID token's, or the response is not to be used.
        if info.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("The provider's userinfo describes another subject than the ID token.")
        # Claims only in the ID token (some providers put groups there and not in userinfo) still count.
        return {**payload, **info}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("The provider sent no subject.")
        user = services.oidc_user_sign_in(issuer=self.issuer, claims=claims)
        services.directory_sync(user=user, groups=groups_from_claim(claims.get(settings.OIDC_GROUPS_CLAIM)), via="oidc")
        if settings.OIDC_UID_CLAIM:
            services.unix_uid_from_directory(
                user=user, value=claims.get(settings.OIDC_UID_CLAIM), source=UnixAccountSource.OIDC
            )
        return user


def groups_from_claim(value: object) -> list[str]:
    """A groups claim as a list of names: providers send a list, a single string, or nothing."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(v) for v in value if isinstance(v, str | int)]
    return []
