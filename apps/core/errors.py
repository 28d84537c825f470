"""One application error type, mapped to HTTP in one place (apps/core/api/exceptions.py).

Services raise these; views never build error responses by hand. The JSON shape is the API's (docs/api.md):
`{"code": "...", "detail": "...", "fields": {...}}`, plus optional extra keys (e.g. `conflicts`, `remaining`).
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    """A refusal a client can act on: status, machine-readable code, human detail, per-field messages."""

    status: int = 400
    code: str = "invalid"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        fields: dict[str, list[str]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.fields = fields or {}
        self.extra = extra or {}

    def as_body(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, "fields": self.fields, **self.extra}


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"


class Forbidden(ApplicationError):
    status = 403
    code = "forbidden"


class QuotaExceeded(ApplicationError):
    status = 403
    code = "quota_exceeded"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class Unavailable(ApplicationError):
    status = 503
    code = "unavailable"
