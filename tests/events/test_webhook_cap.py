"""A team (and the fleet, for endpoints of every team) registers at most WEBHOOK_MAX_ENDPOINTS_PER_TEAM webhooks:
each event goes to every matching endpoint, so the bound is what keeps one event from becoming thousands of
outbound requests. The 409 in the API, the form error on the page, and parallel requests never passing the cap."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.test import Client

from apps.core.errors import Conflict
from apps.events.models import WebhookEndpoint
from apps.events.services import webhook_create
from tests.booking.test_concurrency import race, start_server
from tests.support.overlap import second_write_while_first_is_open

WRITE = ["read", "webhooks:write"]
PUBLIC = "http://93.184.215.14/hook"  # a public address literal: no DNS needed to check it


def _body(team: str | None = "vision") -> dict[str, Any]:
    return {"team": team, "url": PUBLIC, "events": ["job.*"]}


@pytest.mark.django_db
def test_the_webhook_over_the_cap_is_a_409_per_team_and_for_the_fleet(alice, charlie, admin, api_as, settings):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TEAM = 2
    client = api_as(alice, WRITE)
    assert [client.post("/api/v1/webhooks/", _body(), format="json").status_code for _ in range(2)] == [201, 201]
    refused = client.post("/api/v1/webhooks/", _body(), format="json")
    assert refused.status_code == 409
    assert refused.json() == {
        "code": "too_many_webhooks",
        "detail": "Team vision has 2 webhooks, the most allowed: delete one it no longer uses.",
        "fields": {},
    }
    assert WebhookEndpoint.objects.filter(team__slug="vision").count() == 2
    # Another team's and the fleet's endpoints are counted apart.
    ops = api_as(admin, WRITE)
    assert ops.post("/api/v1/webhooks/", _body("nlp"), format="json").status_code == 201
    assert [ops.post("/api/v1/webhooks/", _body(None), format="json").status_code for _ in range(3)] == [201, 201, 409]
    # Deleting one makes room.
    first = WebhookEndpoint.objects.filter(team__slug="vision").order_by("pk").first()
    assert first is not None
    assert client.delete(f"/api/v1/webhooks/{first.pk}/").status_code == 204
    assert client.post("/api/v1/webhooks/", _body(), format="json").status_code == 201


@pytest.mark.django_db
def test_the_webhooks_page_says_why(alice, settings):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TEAM = 0
    browser = Client()
    browser.force_login(alice)
    resp = browser.post("/events/webhooks/", {"team": "vision", "url": PUBLIC, "events": "job.*"})
    assert resp.status_code == 200
    assert "Team vision has 0 webhooks, the most allowed" in resp.content.decode()
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_parallel_requests_never_pass_the_cap(alice, make_token):
    tokens = [make_token(alice, WRITE) for _ in range(8)]
    server = start_server(WEBHOOK_MAX_ENDPOINTS_PER_TEAM="4")
    try:
        responses = race(48, lambda i: ("POST", server.url + "/api/v1/webhooks/", _body(), tokens[i % 8]))
    finally:
        server.stop()
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 4, 409: 44}, codes
    assert WebhookEndpoint.objects.filter(team__slug="vision").count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_second_registration_waits_for_the_first_to_commit_and_is_refused(alice, settings):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TEAM = 1

    def register() -> Any:
        return webhook_create(user=alice, team_slug="vision", url=PUBLIC, events=["job.*"])

    out = second_write_while_first_is_open(register, register)
    assert out["second_waited"]  # on the team's advisory lock
    assert isinstance(out["second"], Conflict) and out["second"].code == "too_many_webhooks"
    assert WebhookEndpoint.objects.filter(team__slug="vision").count() == 1
