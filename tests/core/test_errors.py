"""Every API error in the documented shape; never a 500 or an HTML page."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_unknown_api_path_is_json_404(alice, api_as):
    resp = api_as(alice).get("/api/v1/nope/")
    assert resp.status_code == 404
    assert resp.json() == {"code": "not_found", "detail": "Not found.", "fields": {}}


@pytest.mark.parametrize("debug", [False, True])
def test_unknown_api_paths_are_json_even_under_debug(alice, api_as, settings, debug):
    """The embedded default runs with DEBUG, where Django's own 404 is an HTML page and a POST to a path missing
    its slash is a 500 (APPEND_SLASH cannot redirect a POST)."""
    settings.DEBUG = debug
    client = api_as(alice)
    resp = client.get("/api/v1/nope/")
    assert resp.status_code == 404 and resp.json() == {"code": "not_found", "detail": "Not found.", "fields": {}}
    posted = client.post("/api/v1/jobs", {}, format="json")
    assert posted.status_code == 404 and posted["Content-Type"] == "application/json"
    assert posted.json()["detail"] == "Not found: API paths end with a slash (/api/v1/jobs/)."
    moved = client.get("/api/v1/jobs?state=queued")
    assert moved.status_code == 301 and moved["Location"] == "/api/v1/jobs/?state=queued"
    assert client.get("/api/v1/jobs/nope").status_code == 404  # no endpoint with or without the slash
    # A browser session (CSRF enforced) posting to a path no endpoint has: the same JSON 404, not a CSRF page.
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    refused = browser.delete("/api/v1/group-mappings/not-a-number/")
    assert refused.status_code == 404 and refused.json()["code"] == "not_found"


def test_wrong_method_is_405_in_shape(alice, api_as):
    resp = api_as(alice).put("/api/v1/me", {}, format="json")
    assert resp.status_code in {403, 405}
    assert set(resp.json()) >= {"code", "detail", "fields"}


def test_throttled_is_429_with_retry_after(alice, api_as, monkeypatch):
    from apps.core.api import throttling

    # SimpleRateThrottle reads THROTTLE_RATES from the class; monkeypatch restores the original after the test,
    # so later tests keep the real rates.
    rates = {**throttling.TokenRateThrottle.THROTTLE_RATES, "token": "3/min"}
    monkeypatch.setattr(throttling.TokenRateThrottle, "THROTTLE_RATES", rates)
    client = api_as(alice, ["read"])
    statuses = [client.get("/api/v1/me").status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    resp = client.get("/api/v1/me")
    assert resp.status_code == 429
    assert resp.json()["code"] == "throttled"
    assert int(resp["Retry-After"]) >= 1


def test_unsupported_media_type_is_415_in_shape(alice, api_as):
    resp = api_as(alice).generic("POST", "/api/v1/tokens/", "name=x", content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 415
    assert resp.json()["code"] == "unsupported_media_type"


def test_oversized_body_is_refused_without_500(alice, api_as):
    big = '{"name": "' + "x" * (2 * 1024 * 1024) + '", "scopes": ["read"]}'
    resp = api_as(alice).generic("POST", "/api/v1/tokens/", big, content_type="application/json")
    assert resp.status_code in {400, 413}
    assert "code" in resp.json()


def test_health_needs_no_auth():
    assert APIClient().get("/api/v1/health").status_code == 200


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/api/v1/jobs/?state=%25X", "Unknown state '%X'"),
        ("/api/v1/jobs/?state=queued,%25s%25(x)d", "Unknown state '%s%(x)d'"),
        ("/api/v1/reservations/?status=%25d", "Unknown status: %d."),
        ("/api/v1/usage/?month=%25Y-%25m", "month must look like YYYY-MM."),
    ],
)
def test_a_percent_sign_in_a_filter_value_is_a_400_that_quotes_it(alice, api_as, path, says):
    """The filters' messages are %-formatted by django-filter: a value with '%' in it once made them a 500."""
    resp = api_as(alice).get(path)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["code"] == "invalid" and says in str(body), body
