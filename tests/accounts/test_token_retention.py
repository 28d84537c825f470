"""Token lists are paginated like every list, and tokens that stopped working are deleted after TOKEN_RETENTION_DAYS."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from apps.accounts import services
from apps.accounts.models import ApiToken
from apps.accounts.tasks import prune_tokens
from apps.audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def _token(user, name: str, **fields) -> ApiToken:
    token, _ = services.token_create(user=user, name=name, scopes=["read"], expires_days=30)
    if fields:
        ApiToken.objects.filter(pk=token.pk).update(**fields)
    return token


def test_the_token_list_is_paginated_newest_first(alice, api_as):
    client = api_as(alice, ["read"])  # the client's own token is the first
    for i in range(4):
        _token(alice, f"t{i}")
    first = client.get("/api/v1/tokens/?limit=2").json()
    assert first["count"] == 5 and len(first["results"]) == 2 and first["next"] and first["previous"] is None
    assert [t["name"] for t in first["results"]] == ["t3", "t2"]
    rest = client.get(first["next"]).json()
    assert [t["name"] for t in rest["results"]] == ["t1", "t0"]
    assert all("token" not in t for t in first["results"] + rest["results"])


def test_tokens_stopped_longer_than_the_retention_are_deleted_and_only_those(alice, bob, settings):
    settings.TOKEN_RETENTION_DAYS = 90
    now = timezone.now()
    keep = [
        _token(alice, "active"),
        _token(alice, "revoked-lately", revoked_at=now - timedelta(days=89)),
        _token(bob, "expired-lately", expires_at=now - timedelta(days=10)),
        _token(alice, "no-expiry"),
    ]
    ApiToken.objects.filter(name="no-expiry").update(expires_at=None)
    gone = [
        _token(alice, "revoked-long-ago", revoked_at=now - timedelta(days=91)),
        _token(bob, "expired-long-ago", expires_at=now - timedelta(days=200)),
        # Revoked lately but expired long ago: it stopped working at its expiry.
        _token(bob, "both", revoked_at=now - timedelta(days=1), expires_at=now - timedelta(days=120)),
    ]
    audit_before = AuditEvent.objects.count()

    assert prune_tokens.apply().get() == len(gone)

    assert set(ApiToken.objects.values_list("pk", flat=True)) == {t.pk for t in keep}
    assert AuditEvent.objects.count() == audit_before  # the audit log keeps its own record of each token
    assert prune_tokens.apply().get() == 0


def test_pruning_deletes_in_batches_and_can_be_turned_off(alice, settings):
    old = timezone.now() - timedelta(days=400)
    for i in range(7):
        _token(alice, f"old{i}", revoked_at=old)
    settings.TOKEN_RETENTION_DAYS = 0
    assert services.tokens_prune() == 0 and ApiToken.objects.count() == 7
    settings.TOKEN_RETENTION_DAYS = 90
    assert services.tokens_prune(batch=3) == 7 and not ApiToken.objects.exists()


def test_the_prune_runs_hourly_on_the_portal_queue():
    schedule = settings.CELERY_BEAT_SCHEDULE["accounts-prune-tokens"]
    assert schedule["task"] == "accounts.prune_tokens" and schedule["schedule"] == 3600.0
    assert schedule["options"]["queue"] == "portal"


def test_the_settings_page_says_how_long_stopped_tokens_stay(alice, client, settings):
    client.force_login(alice)
    _token(alice, "old", revoked_at=timezone.now())
    page = client.get("/accounts/settings/").content.decode()
    assert "revoked" in page and "removed 90 days after they stopped working" in page
    settings.TOKEN_RETENTION_DAYS = 0
    assert 'id="token-retention"' not in client.get("/accounts/settings/").content.decode()
