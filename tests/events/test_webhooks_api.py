"""The webhooks API: registration (secret shown once), rotation, deletion, SSRF refusals and team scoping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.events import conf, outbox, secrets
from apps.events.models import WebhookDelivery, WebhookEndpoint
from apps.events.services import publish

pytestmark = pytest.mark.django_db

WRITE = ["read", "webhooks:write"]
PUBLIC = "http://93.184.215.14/hook"  # a public address literal: no DNS needed to check it


def _create(client: APIClient, **body: Any) -> Any:
    return client.post(
        "/api/v1/webhooks/", {"team": "vision", "url": PUBLIC, "events": ["job.*"], **body}, format="json"
    )


def test_a_manager_registers_a_webhook_and_sees_the_secret_once(api_as: Callable[..., APIClient], alice: Any) -> None:
    client = api_as(alice, WRITE)
    resp = _create(client)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["secret"].startswith("whsec_") and body["team"] == "vision" and body["events"] == ["job.*"]
    stored = WebhookEndpoint.objects.get(pk=body["id"])
    assert body["secret"] not in stored.secret_encrypted
    assert secrets.decrypt(stored.secret_encrypted) == body["secret"]

    page = client.get("/api/v1/webhooks/").json()  # paginated like every list
    assert page["count"] == 1 and page["next"] is None
    listed = page["results"]
    assert [w["id"] for w in listed] == [body["id"]]
    assert "secret" not in listed[0] and body["secret"] not in client.get("/api/v1/webhooks/").content.decode()


def test_rotation_returns_a_new_secret_that_signs_from_then_on(api_as: Callable[..., APIClient], alice: Any) -> None:
    client = api_as(alice, WRITE)
    created = _create(client).json()
    rotated = client.post(f"/api/v1/webhooks/{created['id']}/rotate-secret/")
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != created["secret"]
    assert secrets.decrypt(WebhookEndpoint.objects.get(pk=created["id"]).secret_encrypted) == new


def test_delete(api_as: Callable[..., APIClient], alice: Any) -> None:
    client = api_as(alice, WRITE)
    created = _create(client).json()
    assert client.delete(f"/api/v1/webhooks/{created['id']}/").status_code == 204
    assert not WebhookEndpoint.objects.exists()
    assert client.delete(f"/api/v1/webhooks/{created['id']}/").status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "ftp://93.184.215.14/hook",
    ],
)
def test_internal_addresses_are_refused(api_as: Callable[..., APIClient], alice: Any, url: str) -> None:
    resp = _create(api_as(alice, WRITE), url=url)
    assert resp.status_code == 400, resp.content
    assert resp.json()["code"] == "invalid" and "url" in resp.json()["fields"]
    assert not WebhookEndpoint.objects.exists()


def test_an_allowed_network_may_be_registered(
    api_as: Callable[..., APIClient], alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conf, "ALLOWED_NETWORKS", ["127.0.0.0/8"])
    assert _create(api_as(alice, WRITE), url="http://127.0.0.1:8080/hook").status_code == 201
    assert _create(api_as(alice, WRITE), url="http://10.1.2.3/hook").status_code == 400


def test_unknown_event_types_are_refused(api_as: Callable[..., APIClient], alice: Any) -> None:
    resp = _create(api_as(alice, WRITE), events=["job.*", "jobs.exploded"])
    assert resp.status_code == 400 and "events" in resp.json()["fields"]


def test_members_outsiders_and_read_tokens_cannot_register(
    api_as: Callable[..., APIClient], alice: Any, bob: Any, charlie: Any
) -> None:
    assert _create(api_as(bob, WRITE)).status_code == 403
    assert _create(api_as(charlie, WRITE)).status_code == 400  # not a team of theirs: as if it did not exist
    assert _create(api_as(alice, ["read"])).status_code == 403
    assert _create(api_as(alice, WRITE), team=None).status_code == 400  # every team: admins only
    assert not WebhookEndpoint.objects.exists()


def test_an_admin_registers_for_every_team(api_as: Callable[..., APIClient], admin: Any) -> None:
    resp = _create(api_as(admin, [*WRITE, "admin"]), team=None)
    assert resp.status_code == 201 and resp.json()["team"] is None


def test_other_teams_cannot_list_or_read_deliveries(
    api_as: Callable[..., APIClient], alice: Any, bob: Any, charlie: Any, admin: Any, vision: Any
) -> None:
    created = _create(api_as(alice, WRITE)).json()
    publish("job.succeeded", team_id=vision.pk, subject="jobs/1", data={"id": 1})
    outbox.sweep()
    assert WebhookDelivery.objects.count() == 1
    url = f"/api/v1/webhooks/{created['id']}/deliveries/"

    for outsider in (charlie, bob):  # another team's member; a plain member of the team
        client = api_as(outsider, WRITE)
        assert client.get("/api/v1/webhooks/").json()["results"] == []
        assert client.get(url).status_code == 404
        assert client.post(f"/api/v1/webhooks/{created['id']}/rotate-secret/").status_code == 404
        assert client.delete(f"/api/v1/webhooks/{created['id']}/").status_code == 404

    for reader in (alice, admin):
        page = api_as(reader).get(url).json()
        assert [d["event_type"] for d in page["results"]] == ["job.succeeded"]
        assert page["results"][0]["status"] == "pending" and page["results"][0]["webhook_id"].startswith("msg_")


def test_mail_preferences_api(api_as: Callable[..., APIClient], bob: Any) -> None:
    client = api_as(bob)
    assert client.get("/api/v1/me/notifications/").json()["job_failed"] is False
    resp = client.patch("/api/v1/me/notifications/", {"job_failed": True}, format="json")
    assert resp.status_code == 200 and resp.json()["job_failed"] is True and resp.json()["job_finished"] is False
    assert client.patch("/api/v1/me/notifications/", {"job_failed": "maybe"}, format="json").status_code == 400
