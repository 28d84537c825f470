"""OpenAPI: the request shapes of the most used operations, as tight as what the API accepts.

The job input's fields pass their values through to the job service, which checks them and words the refusal in
one place; its bounds are declared here, from the same settings the service checks against, so that clients and
schema-based test generators send what the API takes. Query parameters that DRF declares as plain strings get the
pattern the view parses."""

from __future__ import annotations

from typing import Any

SLUG = {"type": "string", "pattern": r"^[-a-zA-Z0-9_]+$", "minLength": 1, "maxLength": 50}
MONTH = {"type": "string", "pattern": r"^[0-9]{4}-(0[1-9]|1[0-2])$", "example": "2026-11"}
MODEL_NAME = {"type": "string", "minLength": 1, "maxLength": 64}


def _job_input() -> dict[str, dict[str, Any]]:
    from apps.jobs import conf

    models = {"oneOf": [MODEL_NAME, {"type": "array", "items": MODEL_NAME, "minItems": 1, "maxItems": 32}]}
    return {
        "team": {**SLUG},
        "image": {"type": "string", "minLength": 1, "maxLength": 255},
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": conf.MAX_COMMAND_ARGS},
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": conf.MAX_ENV_VALUE_BYTES},
            "maxProperties": conf.MAX_ENV_VARS,
        },
        "gpu_count": {"type": "integer", "minimum": 1, "maximum": 64, "default": 1},
        "gpu_model": models,
        "gpu_models": models,
        "cpus": {
            "type": "number",
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": conf.MAX_CPUS,
            "default": conf.DEFAULT_CPUS,
        },
        "memory_mib": {
            "type": "integer",
            "minimum": 16,
            "maximum": conf.MAX_MEMORY_MIB,
            "default": conf.DEFAULT_MEMORY_MIB,
        },
        "max_duration_s": {
            "type": "integer",
            "minimum": 1,
            "maximum": conf.MAX_DURATION_S,
            "default": conf.DEFAULT_MAX_DURATION_S,
        },
        "priority": {
            "type": "integer",
            "minimum": conf.MIN_PRIORITY,
            "maximum": conf.STAFF_MAX_PRIORITY,
            "default": 0,
        },
        "reservation": {"type": "integer", "minimum": 1},
    }


_WINDOW_END = "end of the window (ISO 8601), after `start` and at most 92 days after it"
PARAMETERS: dict[str, dict[str, dict[str, Any]]] = {
    "availability_retrieve": {"model": {"schema": MODEL_NAME}, "end": {"description": _WINDOW_END}},
    "booking_timeline_retrieve": {"model": {"schema": MODEL_NAME}, "end": {"description": _WINDOW_END}},
    "reports_monthly_retrieve": {
        "month": {"schema": MONTH},
        "team": {"schema": SLUG},
        "format": {"schema": {"type": "string", "enum": ["json", "csv"], "default": "json"}},
    },
}


def refine_inputs(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the bounds above on the job input and the query parameters."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in ("JobInputRequest", "JobInput"):
        properties = schemas.get(name, {}).get("properties", {})
        for field, schema in _job_input().items():
            if field in properties:
                description = properties[field].get("description")
                properties[field] = {**schema, **({"description": description} if description else {})}
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            changes = PARAMETERS.get(operation.get("operationId", ""), {})
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query" and parameter.get("name") in changes:
                    parameter.update(changes[parameter["name"]])
    return result
