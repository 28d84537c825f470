"""Sign-in page: works, and refuses after too many failures (per username and per IP)."""

from __future__ import annotations

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db


def test_login_works_and_redirects_home(client, alice):
    resp = client.post("/accounts/login/", {"username": "alice", "password": "pw-for-tests"})
    assert resp.status_code == 302
    assert client.get("/").status_code == 200


def test_pages_need_login(client):
    resp = client.get("/")
    assert resp.status_code == 302 and "/accounts/login/" in resp["Location"]


@override_settings(LOGIN_RATE_LIMIT=3)
def test_login_is_rate_limited(client, alice):
    for _ in range(3):
        resp = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
        assert resp.status_code == 200
    resp = client.post("/accounts/login/", {"username": "alice", "password": "pw-for-tests"})
    assert resp.status_code == 200  # the right password is refused while locked
    assert b"Too many failed sign-in attempts" in resp.content
    assert "_auth_user_id" not in client.session


def test_settings_page_creates_token_once(client, alice):
    client.force_login(alice)
    resp = client.post("/accounts/settings/", {"name": "laptop", "scopes": ["read"], "expires_days": 30})
    assert resp.status_code == 200
    token = resp.context["new_token"]
    assert token and token.encode() in resp.content
    again = client.get("/accounts/settings/")
    assert token.encode() not in again.content


def test_settings_page_offers_the_admin_scope_to_staff_only(client, alice, admin):
    client.force_login(alice)
    page = client.get("/accounts/settings/").content.decode()
    assert 'value="read"' in page and 'value="admin"' not in page
    refused = client.post("/accounts/settings/", {"name": "x", "scopes": ["admin"], "expires_days": 30})
    assert refused.context["new_token"] is None and "scopes" in refused.context["form"].errors
    client.force_login(admin)
    assert 'value="admin"' in client.get("/accounts/settings/").content.decode()
