"""schemathesis on the operations that generated clients and their users call most, and whose schema once let
through most data the API then refused: POST /jobs/, POST /reservations/, /availability/, /booking/timeline/ and
/reports/monthly/. In-process (WSGI) on the test database, a bounded deterministic number of examples each, as an
admin and as a member. No 5xx; every status and body as the schema says; bad input gets the error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from portal.wsgi import application

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MAX_EXAMPLES = 30
FIVE = [
    "jobs_create",
    "reservations_create",
    "availability_retrieve",
    "booking_timeline_retrieve",
    "reports_monthly_retrieve",
]

schema = schemathesis.openapi.from_wsgi("/api/schema/", application).include(operation_id=FIVE)


@pytest.fixture(autouse=True)
def _keep_test_connection() -> Iterator[None]:
    """The app runs in this thread on the test's transaction: keep the end of each request from closing it."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def tokens(admin: Any, alice: Any, make_token: Any, settings: Any) -> dict[str, str]:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    from apps.jobs.models import ContainerImage
    from tests.factories import GpuFactory, GpuModelFactory

    model = GpuModelFactory(name="A100-80GB")
    for index in range(4):
        GpuFactory(node__name="fuzz-node" if index == 0 else f"fuzz-node-{index}", model=model, index=0)
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="fuzz")
    scopes = ["read", "jobs:write", "reservations:write"]
    return {"admin": make_token(admin, [*scopes, "admin"]), "manager": make_token(alice, scopes)}


def test_the_five_operations_are_covered() -> None:
    found = {result.ok().definition.raw["operationId"] for result in schema.get_all_operations()}
    assert found == set(FIVE)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_answers_as_documented(case: Any, tokens: dict[str, str]) -> None:
    for role, token in tokens.items():
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        case.validate_response(
            response,
            checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
        )
        if 400 <= response.status_code < 500:
            body = json.loads(response.content or b"null")
            assert isinstance(body, dict) and {"code", "detail", "fields"} <= set(body), (
                f"{case.method} {case.formatted_path} as {role}: {response.status_code}: {body}"
            )
