"""OpenAPI: declare the error responses every operation can give, in the one error shape (docs/api.md).

Views declare their successes; the errors come from shared machinery (authentication, scopes, throttling, the
exception handler, the database-outage handler), so they are declared here once, for every operation, as a
drf-spectacular postprocessing hook. Clients generated from the schema and the fuzz tests
(tests/hardening/test_schema_fuzz.py) then know every status the API can answer with.
"""

from __future__ import annotations

from typing import Any

ERROR_COMPONENT = "Error"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every API error: a machine-readable code, a human detail, per-field messages; some codes add "
    "keys (e.g. `conflicts` for 409 conflict, `remaining` for quota_exceeded).",
    "properties": {
        "code": {"type": "string", "example": "invalid"},
        "detail": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    },
    "required": ["code", "detail", "fields"],
    "additionalProperties": True,
}

_DESCRIPTIONS = {
    "400": "Invalid input (`invalid`, `malformed_request`).",
    "401": "No or bad credentials (`unauthenticated`, `token_expired`, `token_revoked`).",
    "403": "Not allowed (`forbidden`, `insufficient_scope`, `quota_exceeded`).",
    "404": "Not found, or not yours (`not_found`).",
    "405": "Method not allowed for this path.",
    "409": "Conflicts with the current state (`conflict`).",
    "413": "Request body too large (`payload_too_large`).",
    "415": "Body is not JSON (`unsupported_media_type`).",
    "429": "Rate limited (`throttled`); see Retry-After.",
    "503": "A dependency is down (`unavailable`); see Retry-After.",
}
_ALWAYS = ("400", "401", "403", "404", "405", "429", "503")
_WITH_BODY = ("409", "413", "415")
_UNSAFE = {"post", "put", "patch", "delete"}


def declare_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the error responses an operation does not declare itself."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault(ERROR_COMPONENT, ERROR_SCHEMA)
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if operation.get("security") == [{}]:
                continue  # public probes (health) declare their own answers and use none of the machinery
            statuses = _ALWAYS + (_WITH_BODY if method in _UNSAFE else ())
            responses = operation["responses"]
            for status in statuses:
                responses.setdefault(
                    status, {"description": _DESCRIPTIONS[status], "content": {"application/json": {"schema": ref}}}
                )
    return result
