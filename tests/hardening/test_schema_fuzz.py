"""Fuzz every documented operation with schemathesis against the WSGI app in-process, on the test database.

For each GET/POST/PATCH/DELETE operation in /api/schema/: a bounded, deterministic set of generated requests, each
sent with an admin token and with a member's token. Every answer must be: no 5xx; a status the schema declares; a
body that matches the schema for that status; and on 4xx the error shape `{"code", "detail", "fields"}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from portal.wsgi import application

pytestmark = [pytest.mark.django_db]

MAX_EXAMPLES = 12

schema = schemathesis.openapi.from_wsgi("/api/schema/", application).include(method=["GET", "POST", "PATCH", "DELETE"])


@pytest.fixture(autouse=True)
def _keep_test_connection() -> Iterator[None]:
    """The app runs in this thread on the test's transaction: like Django's test client, keep the end of each
    request from closing the connection under the test."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_tokens(admin: Any, bob: Any, make_token: Any, settings: Any) -> dict[str, str]:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    from tests.factories import GpuFactory

    GpuFactory(node__name="fuzz-node")
    member_scopes = ["read", "jobs:write", "reservations:write"]
    return {
        "admin": make_token(admin, [*member_scopes, "admin"]),
        "member": make_token(bob, member_scopes),
    }


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_operation_answers_as_documented(case: Any, fuzz_tokens: dict[str, str]) -> None:
    for role, token in fuzz_tokens.items():
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        case.validate_response(
            response, checks=[not_a_server_error, status_code_conformance, response_schema_conformance]
        )
        if 400 <= response.status_code < 500:
            body = json.loads(response.content or b"null")
            assert isinstance(body, dict) and {"code", "detail", "fields"} <= set(body), (
                f"{case.method} {case.formatted_path} as {role}: {response.status_code} not in the error shape: {body}"
            )
