"""Input that once answered 500: found by sending junk to every endpoint and page of a running demo."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
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


def test_efficiency_page_with_a_team_that_is_no_slug_shows_the_reason(alice: Any):
    browser = Client()
    browser.force_login(alice)
    resp = browser.get("/efficiency/", {"team": "vi/sion"})
    assert resp.status_code == 200
    assert "No team &#x27;vi/sion&#x27; that you belong to." in resp.content.decode()
    # The same team by its slug is the manager's report; with a NUL the query string is refused outright.
    assert "No team" not in browser.get("/efficiency/", {"team": "vision"}).content.decode()
    assert browser.get("/efficiency/", {"team": "vi\x00sion"}).status_code == 400


def test_report_api_with_a_nul_in_the_team_is_refused_in_shape(alice: Any, api_as: Any):
    for path in ("/api/v1/reports/efficiency/", "/api/v1/reports/monthly/"):
        resp = api_as(alice).get(path, {"team": "vi\x00sion"})
        assert resp.status_code in (400, 404), path
        assert set(resp.json()) == {"code", "detail", "fields"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/jobs/", rb'{"team": "vision", "image": "local/process", "command": ["\ud800"]}'),
        ("/api/v1/jobs/", rb'{"team": "vision", "image": "x", "command": ["true"], "gpu_model": "\uDFFFx"}'),
        ("/api/v1/tokens/", rb'{"name": "ci", "scopes": ["\ud800"]}'),
        ("/api/v1/group-mappings/", rb'{"group": "g", "team": "vision", "role": "\udc00"}'),
        (
            "/api/v1/reservations/",
            rb'{"team": "vision", "gpu_count": 1, "gpu_model": "A100-80GB", "note": "\ud800",'
            rb' "start": "2030-01-01T10:00:00Z", "end": "2030-01-01T11:00:00Z"}',
        ),
        ("/api/v1/webhooks/", rb'{"team": "vision", "url": "https://example.org/h", "events": ["job.*"], "\ud800": 1}'),
    ],
)
def test_an_unpaired_surrogate_escape_is_a_parse_error(admin: Any, vision: Any, api_as: Any, path: str, body: bytes):
    """JSON may escape any UTF-16 unit; Python decodes a lone one to a str that UTF-8 (PostgreSQL, the renderer)
    cannot encode."""
    resp = api_as(admin).post(path, data=body, content_type="application/json")
    assert resp.status_code == 400
    assert resp.json() == {
        "code": "malformed_request",
        "detail": "JSON parse error - a string holds an unpaired UTF-16 surrogate (\\ud800-\\udfff).",
        "fields": {},
    }


def test_a_surrogate_pair_escape_is_a_character(alice: Any, api_as: Any):
    body = rb'{"name": "ci \ud83d\ude00", "scopes": ["read"]}'
    resp = api_as(alice).post("/api/v1/tokens/", data=body, content_type="application/json")
    assert resp.status_code == 201
    assert resp.json()["name"] == "ci \N{GRINNING FACE}"


async def _close_code(live: Any, path: str, token: str) -> int | None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    try:
        async with connect(
            f"{live.ws_url}{path}", origin=live.url, additional_headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            await asyncio.wait_for(ws.recv(), 10)
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None
    return None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_websocket_path_no_stream_has_closes_with_4404(alice: Any, make_token: Any, live_portal: Any):
    """Channels' router raised on these and the handshake failed with HTTP 500 (and a traceback in the log)."""
    token = make_token(alice, ["read"])
    for path in ["/ws/nope/", "/ws/jobs/-1/", "/ws/teams/%00/", "/ws/fleet", "/"]:
        assert async_to_sync(_close_code)(live_portal, path, token) == 4404, path


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/gpus/%00/history/"),
        ("post", "/api/v1/gpus/GPU-%00/probe/"),
        ("post", "/api/v1/nodes/%00/drain/"),
        ("post", "/api/v1/nodes/n%001/undrain/"),
        ("post", "/api/v1/gpus/%00/shares/"),
    ],
)
def test_a_nul_in_a_path_segment_names_nothing(admin: Any, api_as: Any, method: str, path: str):
    """`<str:...>` let a percent-encoded NUL through to a PostgreSQL lookup (500)."""
    resp = getattr(api_as(admin), method)(path, {}, format="json")
    assert resp.status_code == 404
    assert set(resp.json()) == {"code", "detail", "fields"}


def test_a_nul_in_a_page_path_names_nothing(admin: Any):
    browser = Client()
    browser.force_login(admin)
    assert browser.get("/fleet/gpus/%00/").status_code == 404
    assert browser.post("/fleet/nodes/%00/drain/").status_code == 404


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/metrics", "node=%00"),  # a node lookup: a DataError, 500
        ("/api/v1/jobs/", "user=a%00b"),
        ("/api/v1/gpus/", "node=%00&model=x"),
    ],
)
def test_a_nul_in_the_query_string_is_refused_in_the_error_shape(admin: Any, api_as: Any, path: str, query: str):
    resp = api_as(admin).get(f"{path}?{query}")
    assert resp.status_code == 400
    detail = "The query string holds a NUL character."
    assert resp.json() == {"code": "malformed_request", "detail": detail, "fields": {}}


@pytest.mark.parametrize("path", ["/admin/jobs/job/", "/admin/auth/user/", "/jobs/", "/costs/"])
def test_a_nul_in_a_page_query_is_a_bad_request(admin: Any, path: str):
    client = Client()
    client.force_login(admin)
    resp = client.get(f"{path}?q=%00")  # the admin's search lookup took it to PostgreSQL
    assert resp.status_code == 400
    assert b"NUL" in resp.content
    assert client.get(f"{path}?q=ok").status_code == 200
