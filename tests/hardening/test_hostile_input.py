"""Input that once answered 500: found by sending junk to every endpoint and page of a running demo."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.jobs.models import Job

pytestmark = pytest.mark.django_db

# Unterminated and terminated: the decoder gives up on depth before it sees the end.
DEEP_BODIES = [b'{"a":' * 2000, b"[" * 5000 + b"]" * 5000]


@pytest.mark.parametrize("body", DEEP_BODIES, ids=["unterminated", "terminated"])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/jobs/"),
        ("post", "/api/v1/reservations/"),
        ("post", "/api/v1/tokens/"),
        ("post", "/api/v1/webhooks/"),
        ("patch", "/api/v1/teams/vision/idle-policy/"),
    ],
)
def test_deeply_nested_json_is_a_parse_error(admin: Any, vision: Any, api_as: Any, method: str, path: str, body: bytes):
    client = api_as(admin)
    resp = getattr(client, method)(path, data=body, content_type="application/json")
    assert resp.status_code == 400
    assert resp.json() == {
        "code": "malformed_request",
        "detail": "JSON parse error - the body is nested too deeply.",
        "fields": {},
    }


@pytest.mark.parametrize("gpu_model", ["A100\x0080GB", ["H100-80GB", "\x00"], "x" * 65])
def test_job_model_names_postgresql_cannot_compare_are_refused(alice: Any, api_as: Any, gpu_model: Any):
    body = {"team": "vision", "image": "local/process", "command": ["true"], "gpu_model": gpu_model}
    resp = api_as(alice).post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 400
    assert resp.json()["fields"] == {"gpu_model": ["model names"]}
    assert not Job.objects.exists()


def test_efficiency_page_with_a_nul_in_the_team_shows_the_reason(alice: Any):
    browser = Client()
    browser.force_login(alice)
    resp = browser.get("/efficiency/", {"team": "vi\x00sion"})
    assert resp.status_code == 200
    assert "No team &#x27;vi\\x00sion&#x27; that you belong to." in resp.content.decode()
    # The same team by its slug is the manager's report.
    assert "No team" not in browser.get("/efficiency/", {"team": "vision"}).content.decode()


def test_report_api_with_a_nul_in_the_team_is_refused_in_shape(alice: Any, api_as: Any):
    for path in ("/api/v1/reports/efficiency/", "/api/v1/reports/monthly/"):
        resp = api_as(alice).get(path, {"team": "vi\x00sion"})
        assert resp.status_code in (400, 404), path
        assert set(resp.json()) == {"code", "detail", "fields"}
