"""Every API error leaves in the API's one shape (docs/api.md): `{"code", "detail", "fields"}`; never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback

from apps.core.errors import ApplicationError

logger = logging.getLogger(__name__)

_CODES: dict[type[drf.APIException], str] = {
    drf.ParseError: "malformed_request",
    drf.AuthenticationFailed: "unauthenticated",
    drf.NotAuthenticated: "unauthenticated",
    drf.PermissionDenied: "forbidden",
    drf.NotFound: "not_found",
    drf.MethodNotAllowed: "method_not_allowed",
    drf.NotAcceptable: "not_acceptable",
    drf.UnsupportedMediaType: "unsupported_media_type",
    drf.Throttled: "throttled",
    drf.ValidationError: "invalid",
}


def _flatten(detail: Any) -> list[str]:
    if isinstance(detail, list):
        out: list[str] = []
        for item in detail:
            out.extend(_flatten(item))
        return out
    if isinstance(detail, dict):
        return [f"{key}: {msg}" for key, value in detail.items() for msg in _flatten(value)]
    return [str(detail)]


def _validation_body(exc: drf.ValidationError) -> dict[str, Any]:
    detail = exc.detail
    fields: dict[str, list[str]] = {}
    general: list[str] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key in {"non_field_errors", "__all__"}:
                general.extend(_flatten(value))
            else:
                fields[str(key)] = _flatten(value)
    else:
        general.extend(_flatten(detail))
    summary = "; ".join(general) if general else "Some fields are invalid."
    return {"code": "invalid", "detail": summary, "fields": fields}


def _address_throttle_wait(context: dict[str, Any]) -> float | None:
    """Seconds to wait when the client's address is over its rate; None when it is not (or unknown)."""
    from apps.core.api.throttling import IpRateThrottle

    request, view = context.get("request"), context.get("view")
    if request is None or view is None or getattr(view, "throttle_exempt", False):
        return None
    throttle = IpRateThrottle()
    if throttle.allow_request(request, view):
        return None
    return throttle.wait() or 1.0


def error_response(status: int, code: str, detail: str, **extra: Any) -> Response:
    return Response({"code": code, "detail": detail, "fields": {}, **extra}, status=status)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        set_rollback()
        return Response(exc.as_body(), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        set_rollback()
        return Response(
            {"code": "payload_too_large", "detail": "The request body is too large.", "fields": {}}, status=413
        )
    if isinstance(exc, Http404):
        exc = drf.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    if isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DatabaseError) and "connection" in str(exc).lower()
    ):
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        set_rollback()
        return Response(
            {"code": "unavailable", "detail": "The database is unavailable; retry shortly.", "fields": {}},
            status=503,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        # DRF authenticates before it throttles, so requests that fail authentication would never be counted:
        # charge them to the client address, so a flood of anonymous calls or guessed tokens is cut off too.
        wait = _address_throttle_wait(context)
        if wait is not None:
            exc = drf.Throttled(wait)
    if not isinstance(exc, drf.APIException):
        return None  # a real bug: Django's 500 handler answers in the same shape (apps.core.views)

    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None) is not None:
        headers["Retry-After"] = str(max(1, int(exc.wait)))  # type: ignore[attr-defined]
    set_rollback()
    if isinstance(exc, drf.ValidationError):
        return Response(_validation_body(exc), status=exc.status_code, headers=headers)
    code = next((c for klass, c in _CODES.items() if isinstance(exc, klass)), "error")
    if isinstance(exc.detail, (list, dict)):
        detail = "; ".join(_flatten(exc.detail))
    else:
        detail = str(exc.detail)
        detail_code = getattr(exc.detail, "code", None)
        # Permission classes may refine the code (e.g. "insufficient_scope").
        if isinstance(detail_code, str) and detail_code not in {
            "permission_denied",
            "not_authenticated",
            "authentication_failed",
        }:
            code = detail_code if code in {"forbidden", "unauthenticated"} else code
    return Response({"code": code, "detail": detail, "fields": {}}, status=exc.status_code, headers=headers)
