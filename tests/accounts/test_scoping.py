"""Team scoping on every endpoint so far: owner (alice), teammate (bob), outsider (charlie), admin, anonymous."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def cast(alice, bob, charlie, admin):
    return {"alice": alice, "bob": bob, "charlie": charlie, "admin": admin}


@pytest.mark.parametrize(
    "who,status",
    [("alice", 200), ("bob", 200), ("charlie", 404), ("admin", 200), (None, 401)],
)
def test_team_detail_visibility(cast, api_as, who, status):
    resp = api_as(cast[who] if who else None).get("/api/v1/teams/vision/")
    assert resp.status_code == status
    if status == 200:
        assert resp.json()["slug"] == "vision"
    else:
        assert set(resp.json()) >= {"code", "detail", "fields"}


@pytest.mark.parametrize(
    "who,slugs",
    [("alice", ["vision"]), ("bob", ["vision"]), ("charlie", ["nlp"]), ("admin", ["nlp", "vision"])],
)
def test_team_list_shows_only_own_teams(cast, api_as, who, slugs):
    body = api_as(cast[who]).get("/api/v1/teams/").json()
    assert [t["slug"] for t in body["results"]] == slugs


def test_team_detail_shows_members_and_role(cast, api_as):
    body = api_as(cast["bob"]).get("/api/v1/teams/vision/").json()
    assert body["my_role"] == "member"
    assert {m["username"]: m["role"] for m in body["members"]} == {"alice": "manager", "bob": "member"}


@pytest.mark.parametrize(
    "path", ["/api/v1/me", "/api/v1/tokens/", "/api/v1/teams/", "/api/v1/teams/vision/", "/api/v1/gpu-models/"]
)
def test_anonymous_gets_401_everywhere(cast, api_as, path):
    resp = api_as(None).get(path)
    assert resp.status_code == 401
    assert resp.json()["code"] == "unauthenticated"


def test_outsider_cannot_revoke_someone_elses_token(cast, api_as, make_token):
    make_token(cast["alice"])
    from apps.accounts.models import ApiToken

    alices = ApiToken.objects.get(user=cast["alice"])
    resp = api_as(cast["charlie"]).delete(f"/api/v1/tokens/{alices.pk}/")
    assert resp.status_code == 404
    alices.refresh_from_db()
    assert alices.revoked_at is None


def test_token_list_shows_only_own_tokens(cast, api_as, make_token):
    make_token(cast["alice"])
    body = api_as(cast["charlie"], ["read"]).get("/api/v1/tokens/").json()["results"]
    assert len(body) == 1  # only the token the client itself uses
