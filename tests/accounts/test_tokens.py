"""Personal API tokens: created once, stored hashed, scoped, expiring; every refusal in the error shape."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_token_created_over_api_is_shown_once_and_stored_hashed(alice, api_as):
    client = api_as(alice, ["read"])
    resp = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["read"], "expires_days": 7}, format="json")
    assert resp.status_code == 201, resp.content
    plaintext = resp.json()["token"]
    assert plaintext.startswith("gpp_")
    row = ApiToken.objects.get(pk=resp.json()["id"])
    # The database holds no plaintext: not in any column.
    for value in (row.prefix, row.digest, row.name, str(row.scopes)):
        assert plaintext not in value
    assert row.digest != plaintext and len(row.digest) == 64
    # The listing never shows it again.
    listing = client.get("/api/v1/tokens/").json()["results"]
    assert listing and all("token" not in item for item in listing)
    # And it works.
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    me = other.get("/api/v1/me")
    assert me.status_code == 200
    assert me.json()["username"] == "alice"
    assert me.json()["token_scopes"] == ["read"]


def test_valid_token_authenticates(alice, make_token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(alice)}")
    body = client.get("/api/v1/me").json()
    assert body["username"] == "alice"
    assert body["teams"] == [{"team": {"slug": "vision", "name": "Computer Vision", "share": 1}, "role": "manager"}]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer gpp_0123456789_" + "x" * 43,
        "Bearer nonsense",
        "Bearer",
        "Bearer a b",
        "Bearer gpn_0123456789_" + "y" * 30,
    ],
)
def test_wrong_token_is_401_with_error_shape(alice, make_token, header):
    make_token(alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    resp = client.get("/api/v1/me")
    assert resp.status_code == 401
    body = resp.json()
    assert body["code"] == "unauthenticated"
    assert set(body) >= {"code", "detail", "fields"}
    assert resp["WWW-Authenticate"] == "Bearer"


def test_tampered_secret_with_valid_prefix_is_refused(alice, make_token):
    plaintext = make_token(alice)
    tampered = plaintext[:-4] + ("AAAA" if not plaintext.endswith("AAAA") else "BBBB")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tampered}")
    assert client.get("/api/v1/me").status_code == 401


def test_expired_token_is_401_token_expired(alice, make_token):
    plaintext = make_token(alice, expires_days=1)
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    resp = client.get("/api/v1/me")
    assert resp.status_code == 401
    assert resp.json()["code"] == "token_expired"


def test_revoked_token_is_401(alice, make_token):
    plaintext = make_token(alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    token_id = ApiToken.objects.get().pk
    assert client.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    resp = client.get("/api/v1/me")
    assert resp.status_code == 401
    assert resp.json()["code"] == "token_revoked"


def test_token_lacking_scope_is_403(alice, make_token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(alice, ['read'])}")
    resp = client.post("/api/v1/tokens/", {"name": "x", "scopes": ["jobs:write"]}, format="json")
    assert resp.status_code == 403
    assert resp.json()["code"] == "insufficient_scope"
    assert ApiToken.objects.count() == 1


def test_non_admin_cannot_mint_admin_token(alice, client):
    client.force_login(alice)
    resp = client.post("/api/v1/tokens/", {"name": "x", "scopes": ["admin"]}, content_type="application/json")
    # A browser session POST without CSRF is refused before anything else.
    assert resp.status_code == 403
    api = APIClient(enforce_csrf_checks=False)
    api.force_authenticate(alice)
    resp = api.post("/api/v1/tokens/", {"name": "x", "scopes": ["admin"]}, format="json")
    assert resp.status_code == 403
    assert resp.json()["code"] == "forbidden"
    assert not ApiToken.objects.exists()


def test_malformed_json_is_400_not_500(alice, api_as):
    client = api_as(alice, ["read"])
    resp = client.generic("POST", "/api/v1/tokens/", "{not json", content_type="application/json")
    assert resp.status_code == 400
    assert resp.json()["code"] == "malformed_request"


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"name": "x", "scopes": "read"}, "scopes"),
        ({"name": "x", "scopes": ["root"]}, "scopes"),
        ({"name": "", "scopes": ["read"]}, "name"),
        ({"name": "x", "scopes": ["read"], "expires_days": "soon"}, "expires_days"),
        ({"name": "x", "scopes": ["read"], "expires_days": 100000}, "expires_days"),
        ({"name": ["x"], "scopes": ["read"]}, "name"),
    ],
)
def test_wrong_types_are_400_with_fields(alice, api_as, payload, field):
    client = api_as(alice, ["read"])
    before = ApiToken.objects.count()
    resp = client.post("/api/v1/tokens/", payload, format="json")
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["code"] == "invalid"
    assert field in body["fields"]
    assert ApiToken.objects.count() == before


def test_create_token_command_prints_only_the_token(alice, capsys):
    call_command("create_token", "alice", "--scope", "read", "--scope", "jobs:write", "--expires-days", "3")
    out = capsys.readouterr().out.strip()
    assert out.startswith("gpp_") and "\n" not in out
    token = ApiToken.objects.get()
    assert token.scopes == ["jobs:write", "read"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {out}")
    assert client.get("/api/v1/me").status_code == 200


def test_tokens_never_appear_in_logs(alice, make_token, caplog):
    plaintext = make_token(alice)
    caplog.set_level(logging.DEBUG)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    client.get("/api/v1/me")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}x")
    client.get("/api/v1/me")
    # Even if some code logs a token by mistake, the redacting filter masks it.
    from workers.logredact import RedactSecretsFilter

    record = logging.LogRecord("t", logging.INFO, __file__, 1, "header Authorization: Bearer %s", (plaintext,), None)
    RedactSecretsFilter().filter(record)
    assert plaintext not in record.getMessage()
    secret = plaintext.split("_", 2)[2]
    assert all(secret not in r.getMessage() for r in caplog.records)
