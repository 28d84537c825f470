"""OpenAPI: declare the error responses every operation can give, in the one error shape (docs/api.md).

Views declare their successes; the errors come from shared machinery (authentication, scopes, throttling, the
exception handler, the database-outage handler), so they are declared here once, for every operation, as a
drf-spectacular postprocessing hook. Clients generated from the schema and the fuzz tests
(tests/hardening/test_schema_fuzz.py) then know every status the API can answer with.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import get_doc
from drf_spectacular.utils import OpenApiParameter

ERROR_COMPONENT = "Error"

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Any unique string up to 255 characters (e.g. a UUID). A retry with the same key and body gets the "
    "first answer (with `Idempotent-Replayed: true`) instead of doing the work twice; the same key with another "
    "body is refused (409 `idempotency_key_reused`). Keys are kept for 24 hours.",
)


class PortalAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, plus the `Idempotency-Key` header on every operation whose handler honours it
    (apps.core.idempotency.idempotent marks them), so that generated clients can send it."""

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        handler = getattr(self.view, self.method.lower(), None)
        if getattr(handler, "honours_idempotency_key", False):
            parameters.append(IDEMPOTENCY_KEY)
        return parameters


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


def _internal_docs() -> set[str]:
    """Docstrings of base classes that say how the code works: drf-spectacular falls back to them for views and
    serializers without a docstring of their own, and they are no description of an operation or a shape."""
    from apps.core.api.base import PortalAPIView
    from portal.internals.drf_output import FastOutputMixin

    return {get_doc(FastOutputMixin), get_doc(PortalAPIView)}


def _summary_from_id(operation_id: str) -> str:
    words = operation_id.split("_")
    verb = {"list": "List", "create": "Create", "retrieve": "Get", "destroy": "Delete", "partial": "Change"}
    head = next((i for i, w in enumerate(words) if w in verb), len(words))
    return " ".join([verb.get(words[head], "Call") if head < len(words) else "Call", *words[:head]]).capitalize()


def describe_operations(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: each operation its own summary and description (apps/core/api/
    operations.py), and no description that is about the code rather than the API."""
    from apps.core.api.operations import COMPONENTS, OPERATIONS

    internal = _internal_docs()
    seen: set[str] = set()
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or "operationId" not in operation:
                continue
            summary, description = OPERATIONS.get(operation["operationId"], (None, None))
            summary = summary or _summary_from_id(operation["operationId"])
            while summary in seen:  # unique, also for an operation the table does not know yet
                summary += f" ({operation['operationId']})"
            seen.add(summary)
            operation["summary"] = summary
            if description:
                operation["description"] = description
            elif operation.get("description") in internal:
                operation.pop("description")
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name in COMPONENTS:
            component["description"] = COMPONENTS[name]
        elif component.get("description") in internal:
            component.pop("description")
    return result


_NOTE = re.compile(r"\b(Redis|HMGET|Celery|SQL|GIL|cache[ds]?|µs|ms)\b")


def implementation_notes(schema: dict[str, Any]) -> list[str]:
    """Descriptions in the schema that mention internals (for the schema's tests)."""
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("description", "summary") and isinstance(value, str) and _NOTE.search(value):
                    found.append(f"{where}: {value}")
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(schema, "")
    return found
