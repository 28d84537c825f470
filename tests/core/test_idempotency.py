"""Idempotency-Key on POST: a retry replays the first answer; a different body with the same key is refused;
concurrent requests with one key do the work once."""

from __future__ import annotations

import threading

import pytest

from apps.accounts.models import ApiToken


@pytest.mark.django_db
def test_retry_with_same_key_replays_first_response(alice, api_as):
    client = api_as(alice, ["read"])
    payload = {"name": "ci", "scopes": ["read"]}
    first = client.post("/api/v1/tokens/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    second = client.post("/api/v1/tokens/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert ApiToken.objects.filter(name="ci").count() == 1


@pytest.mark.django_db
def test_same_key_different_body_is_409(alice, api_as):
    client = api_as(alice, ["read"])
    client.post("/api/v1/tokens/", {"name": "a", "scopes": ["read"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    resp = client.post("/api/v1/tokens/", {"name": "b", "scopes": ["read"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert resp.status_code == 409
    assert resp.json()["code"] == "idempotency_key_reused"
    assert not ApiToken.objects.filter(name="b").exists()


@pytest.mark.django_db
def test_validation_error_is_replayed_too(alice, api_as):
    client = api_as(alice, ["read"])
    bad = {"name": "x", "scopes": ["nope"]}
    assert client.post("/api/v1/tokens/", bad, format="json", HTTP_IDEMPOTENCY_KEY="k-3").status_code == 400
    assert client.post("/api/v1/tokens/", bad, format="json", HTTP_IDEMPOTENCY_KEY="k-3").status_code == 400


@pytest.mark.django_db
def test_a_refusal_echoing_a_nul_in_a_field_name_is_stored_and_replayed(alice, api_as):
    # PostgreSQL's jsonb cannot hold \u0000: the stored answer must not turn this 400 into a 500.
    client = api_as(alice, ["read", "jobs:write"])
    body = {"image": "x", "command": ["true"], "a\x00b": 1}
    first = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-nul")
    assert first.status_code == 400 and first.json()["code"] == "invalid"
    again = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-nul")
    assert again.status_code == 400 and again["Idempotent-Replayed"] == "true"
    assert "a\ufffdb" in again.json()["fields"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_create_once(alice, make_token, live_portal):
    import requests

    token = make_token(alice, ["read"])
    results: list[int] = []
    barrier = threading.Barrier(8)

    def post() -> None:
        barrier.wait()
        resp = requests.post(
            f"{live_portal.url}/api/v1/tokens/",
            json={"name": "race", "scopes": ["read"]},
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "race-1"},
            timeout=30,
        )
        results.append(resp.status_code)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ApiToken.objects.filter(name="race").count() == 1
    assert set(results) <= {201, 409}
    assert 201 in results


@pytest.mark.django_db
def test_an_expired_key_is_claimed_afresh(alice, api_as):
    from datetime import timedelta

    from django.utils import timezone

    from apps.core.idempotency import KEY_TTL
    from apps.core.models import IdempotencyRecord

    client = api_as(alice, ["read"])
    first = client.post(
        "/api/v1/tokens/", {"name": "old", "scopes": ["read"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-9"
    )
    assert first.status_code == 201
    IdempotencyRecord.objects.filter(key="k-9").update(created_at=timezone.now() - KEY_TTL - timedelta(minutes=1))
    # A day later the key is free: a different body is new work, not `idempotency_key_reused`.
    second = client.post(
        "/api/v1/tokens/", {"name": "new", "scopes": ["read"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-9"
    )
    assert second.status_code == 201, second.json()
    assert "Idempotent-Replayed" not in second
    assert ApiToken.objects.filter(name="new").count() == 1
    record = IdempotencyRecord.objects.get(key="k-9")
    assert record.created_at > timezone.now() - timedelta(minutes=1) and record.status_code == 201
    # And within the day it replays again.
    third = client.post(
        "/api/v1/tokens/", {"name": "new", "scopes": ["read"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-9"
    )
    assert third["Idempotent-Replayed"] == "true" and third.json() == second.json()


@pytest.mark.django_db
def test_the_beat_task_purges_expired_records_in_batches(alice, bob):
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from apps.core import idempotency
    from apps.core.models import IdempotencyRecord
    from apps.core.tasks import purge_idempotency_records

    def record(user, key: str, age: timedelta) -> None:
        row = IdempotencyRecord.objects.create(user=user, key=key, method="POST", path="/x", fingerprint="f")
        IdempotencyRecord.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)

    for i in range(7):
        record(alice if i % 2 else bob, f"old-{i}", idempotency.KEY_TTL + timedelta(hours=1))
    record(alice, "fresh", timedelta(hours=1))
    assert idempotency.idempotency_records_purge(batch=3) == 7
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh"]
    record(bob, "old-again", idempotency.KEY_TTL + timedelta(minutes=5))
    assert purge_idempotency_records.apply().get() == 1
    schedule = settings.CELERY_BEAT_SCHEDULE["core-purge-idempotency-records"]
    assert schedule["task"] == "core.purge_idempotency_records" and schedule["schedule"] == 3600.0
