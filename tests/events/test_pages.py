"""The webhooks pages (managers and admins; team-scoped) and the mail preferences page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.events import conf, outbox, secrets
from apps.events.models import MailPreference, WebhookEndpoint
from apps.events.services import publish

pytestmark = pytest.mark.django_db


def _endpoint(team: Any) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(
        team=team,
        url="http://93.184.215.14/vision-hook",
        events=["job.*"],
        secret_encrypted=secrets.encrypt(secrets.new_secret()),
    )


def test_a_manager_registers_a_webhook_and_sees_its_secret_once(client: Client, alice: Any) -> None:
    client.force_login(alice)
    resp = client.post(
        "/events/webhooks/", {"team": "vision", "url": "http://93.184.215.14/hook", "events": ["job.*", "node.*"]}
    )
    assert resp.status_code == 200
    html = resp.content.decode()
    endpoint = WebhookEndpoint.objects.get()
    secret = secrets.decrypt(endpoint.secret_encrypted)
    assert 'id="new-secret"' in html and secret in html and endpoint.events == ["job.*", "node.*"]
    again = client.get("/events/webhooks/").content.decode()
    assert secret not in again and "http://93.184.215.14/hook" in again


def test_an_internal_url_is_a_form_error(client: Client, alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conf, "ALLOWED_NETWORKS", [])
    client.force_login(alice)
    resp = client.post("/events/webhooks/", {"team": "vision", "url": "http://10.0.0.5/hook", "events": ["job.*"]})
    assert resp.status_code == 200 and "private, loopback or link-local" in resp.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_the_delivery_log_is_for_the_teams_managers_and_admins(
    client: Client, alice: Any, bob: Any, charlie: Any, admin: Any, vision: Any
) -> None:
    endpoint = _endpoint(vision)
    publish("job.failed", team_id=vision.pk, subject="jobs/77", data={"id": 77})
    outbox.sweep()
    url = f"/events/webhooks/{endpoint.pk}/"
    for reader in (alice, admin):
        client.force_login(reader)
        html = client.get(url).content.decode()
        assert "jobs/77" in html and "job.failed" in html and "<svg" in html
    for outsider in (bob, charlie):
        client.force_login(outsider)
        assert client.get(url).status_code == 404
        assert "vision-hook" not in client.get("/events/webhooks/").content.decode()
        assert client.post(f"{url}rotate-secret/").status_code == 404
        assert client.post(f"{url}delete/").status_code == 404
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


def test_rotation_and_deletion_from_the_page(client: Client, alice: Any, vision: Any) -> None:
    endpoint = _endpoint(vision)
    old = secrets.decrypt(endpoint.secret_encrypted)
    client.force_login(alice)
    html = client.post(f"/events/webhooks/{endpoint.pk}/rotate-secret/").content.decode()
    endpoint.refresh_from_db()
    new = secrets.decrypt(endpoint.secret_encrypted)
    assert new != old and new in html and old not in html
    resp = client.post(f"/events/webhooks/{endpoint.pk}/delete/")
    assert resp.status_code == 302 and not WebhookEndpoint.objects.exists()


def test_mail_preferences_page(client: Client, bob: Any) -> None:
    client.force_login(bob)
    html = client.get("/events/notifications/").content.decode()
    assert "bob@example.org" in html and "My jobs that fail" in html
    resp = client.post("/events/notifications/", {"job_failed": "on", "idle_warnings": "on"})
    assert resp.status_code == 302
    preference = MailPreference.objects.get(user=bob)
    assert (preference.job_failed, preference.idle_warnings, preference.job_finished) == (True, True, False)


def test_anonymous_is_sent_to_sign_in(client: Client) -> None:
    for url in ("/events/webhooks/", "/events/notifications/"):
        resp = client.get(url)
        assert resp.status_code == 302 and "/accounts/login/" in resp["Location"]


def test_admin_lists_endpoints_without_their_secret(client: Client, admin: Any, vision: Any) -> None:
    endpoint = _endpoint(vision)
    publish("job.failed", team_id=vision.pk, subject="jobs/5", data={})
    client.force_login(admin)
    for path in ("webhookendpoint/", f"webhookendpoint/{endpoint.pk}/change/", "outboxevent/", "webhookdelivery/"):
        resp = client.get(f"/admin/events/{path}")
        assert resp.status_code == 200, path
        assert endpoint.secret_encrypted not in resp.content.decode()
