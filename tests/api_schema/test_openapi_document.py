"""The OpenAPI document as other tools read it: valid for openapi-spec-validator; each operation its own summary;
`Idempotency-Key` declared on exactly the POSTs that honour it; no implementation notes in its descriptions."""

from __future__ import annotations

from typing import Any

import pytest
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from openapi_spec_validator import validate

from apps.core.api.schema import implementation_notes

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    return schema


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict) and "operationId" in operation
    ]


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validate(document)


def test_each_operation_has_a_summary_of_its_own(document: dict[str, Any]) -> None:
    summaries = [op.get("summary") for _, _, op in _operations(document)]
    assert all(summaries), [f"{m} {p}" for m, p, op in _operations(document) if not op.get("summary")]
    assert len(set(summaries)) == len(summaries), sorted(s for s in summaries if summaries.count(s) > 1)
    # Views that serve several methods: a description per method, not the class's for both.
    descriptions = {(m, p): op.get("description") for m, p, op in _operations(document)}
    assert descriptions[("GET", "/api/v1/jobs/")] != descriptions[("POST", "/api/v1/jobs/")]
    assert descriptions[("GET", "/api/v1/reservations/")] != descriptions[("POST", "/api/v1/reservations/")]


def test_idempotency_key_is_declared_where_it_is_honoured(document: dict[str, Any]) -> None:
    honoured = set()
    for path, _regex, method, callback in EndpointEnumerator().get_api_endpoints():
        handler = getattr(getattr(callback, "cls", None), method.lower(), None)
        if getattr(handler, "honours_idempotency_key", False):
            honoured.add((method, path))
    assert {("POST", "/api/v1/jobs/"), ("POST", "/api/v1/reservations/")} <= honoured
    declared = {
        (m, p)
        for m, p, op in _operations(document)
        if any(q["in"] == "header" and q["name"] == "Idempotency-Key" for q in op.get("parameters", []))
    }
    assert declared == honoured


def test_no_implementation_notes_in_descriptions(document: dict[str, Any]) -> None:
    assert implementation_notes(document) == []
    text = str(document)
    for internal in ("Renders an instance from a plan", "Plain API view", "HMGET", "checked by the service"):
        assert internal not in text


def test_the_job_input_is_bounded(document: dict[str, Any]) -> None:
    from apps.jobs import conf

    job = document["components"]["schemas"]["JobInputRequest"]["properties"]
    assert job["gpu_count"]["minimum"] == 1 and job["max_duration_s"]["maximum"] == conf.MAX_DURATION_S
    assert job["cpus"]["exclusiveMinimum"] is True and job["priority"]["minimum"] == conf.MIN_PRIORITY
    assert job["team"]["pattern"] == r"^[-a-zA-Z0-9_]+$"
    report = {q["name"]: q for q in document["paths"]["/api/v1/reports/monthly/"]["get"]["parameters"]}
    assert report["month"]["schema"]["pattern"] and report["format"]["schema"]["enum"] == ["json", "csv"]
