"""An account holds at most TOKEN_MAX_ACTIVE_PER_USER active tokens: the 409 in the API and on the settings page,
revoked and expired tokens not counted, and parallel requests never passing the cap."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.services import token_create
from apps.core.errors import Conflict
from tests.booking.test_concurrency import race, start_server
from tests.support.overlap import second_write_while_first_is_open


def _body(name: str) -> dict[str, Any]:
    return {"name": name, "scopes": ["read"], "expires_days": 30}


@pytest.mark.django_db
def test_the_token_over_the_cap_is_a_409_and_revoked_or_expired_ones_do_not_count(alice, api_as, settings):
    settings.TOKEN_MAX_ACTIVE_PER_USER = 3
    client = api_as(alice)  # holds one token already
    assert [client.post("/api/v1/tokens/", _body(f"t{i}"), format="json").status_code for i in range(2)] == [201, 201]
    refused = client.post("/api/v1/tokens/", _body("one too many"), format="json")
    assert refused.status_code == 409
    assert refused.json() == {
        "code": "too_many_tokens",
        "detail": "You have 3 active tokens, the most one account may hold: revoke one you no longer use.",
        "fields": {},
    }
    assert ApiToken.objects.filter(user=alice).count() == 3
    made = ApiToken.objects.filter(user=alice, name="t0").get()
    made.expires_at = timezone.now() - timedelta(seconds=1)
    made.save(update_fields=["expires_at"])
    assert client.post("/api/v1/tokens/", _body("after expiry"), format="json").status_code == 201
    other = ApiToken.objects.filter(user=alice, name="t1").get()
    assert client.delete(f"/api/v1/tokens/{other.pk}/").status_code in (200, 204)
    assert client.post("/api/v1/tokens/", _body("after revoking"), format="json").status_code == 201
    assert client.post("/api/v1/tokens/", _body("full again"), format="json").status_code == 409


@pytest.mark.django_db
def test_the_settings_page_says_why(alice, settings):
    settings.TOKEN_MAX_ACTIVE_PER_USER = 0
    browser = Client()
    browser.force_login(alice)
    resp = browser.post("/accounts/settings/", {"name": "laptop", "scopes": ["read"], "expires_days": "30"})
    assert resp.status_code == 200
    assert "You have 0 active tokens, the most one account may hold" in resp.content.decode()
    assert not ApiToken.objects.filter(user=alice).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_parallel_requests_never_pass_the_cap(alice, make_token):
    # One client token per worker process: requests with one token wait for each other on its row (last use).
    tokens = [make_token(alice, ["read"]) for _ in range(3)]
    server = start_server(TOKEN_MAX_ACTIVE_PER_USER="8")
    try:
        responses = race(48, lambda i: ("POST", server.url + "/api/v1/tokens/", _body(f"ci-{i}"), tokens[i % 3]))
    finally:
        server.stop()
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 5, 409: 43}, codes
    assert ApiToken.objects.filter(user=alice, revoked_at__isnull=True).count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_second_token_waits_for_the_first_to_commit_and_is_refused(alice, settings):
    settings.TOKEN_MAX_ACTIVE_PER_USER = 1

    def mint() -> Any:
        return token_create(user=alice, name="ci", scopes=["read"], expires_days=30)

    out = second_write_while_first_is_open(mint, mint)
    assert out["second_waited"]  # on alice's row lock
    assert isinstance(out["second"], Conflict) and out["second"].code == "too_many_tokens"
    assert ApiToken.objects.filter(user=alice).count() == 1
