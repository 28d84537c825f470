"""One person holds at most WAITLIST_MAX_WAITING_PER_USER open waitlist entries (waiting or notified): entries are
served oldest first, a bounded number per pass, so a flood from one person would sit in front of everyone else's.
Resolved and expired entries do not count; parallel requests never pass the cap."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.core.errors import Conflict
from apps.efficiency.models import WaitlistEntry, WaitState
from apps.efficiency.waitlist import waitlist_join
from tests.booking.test_concurrency import race, start_server
from tests.support.overlap import second_write_while_first_is_open

URL = "/api/v1/waitlist/"


def _body() -> dict[str, Any]:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(days=1)
    return {"team": "vision", "gpu_model": "H100-80GB", "gpu_count": 1, "start": start.isoformat(),
            "end": (start + timedelta(hours=2)).isoformat()}  # fmt: skip


@pytest.mark.django_db
def test_the_entry_over_the_cap_is_a_409_and_resolved_or_expired_ones_do_not_count(api_as, bob, alice, fleet,
                                                                                    settings):  # fmt: skip
    settings.WAITLIST_MAX_WAITING_PER_USER = 2
    client = api_as(bob)
    assert [client.post(URL, _body(), format="json").status_code for _ in range(2)] == [201, 201]
    refused = client.post(URL, _body(), format="json")
    assert refused.status_code == 409
    assert refused.json() == {
        "code": "too_many_waiting",
        "detail": "You are waiting on 2 waitlist entries, the most one person may: leave one you no longer need first.",
        "fields": {},
    }
    assert WaitlistEntry.objects.filter(user=bob).count() == 2
    # Another person is not held back by bob's entries.
    assert api_as(alice).post(URL, _body(), format="json").status_code == 201
    # Leaving one makes room; an entry whose window is over does not count either.
    first, second = WaitlistEntry.objects.filter(user=bob).order_by("pk")
    assert client.delete(f"{URL}{first.pk}/").status_code == 200
    assert client.post(URL, _body(), format="json").status_code == 201
    WaitlistEntry.objects.filter(pk=second.pk).update(
        start=timezone.now() - timedelta(hours=3), end=timezone.now() - timedelta(hours=1)
    )
    assert client.post(URL, _body(), format="json").status_code == 201
    assert client.post(URL, _body(), format="json").status_code == 409
    assert WaitlistEntry.objects.filter(user=bob, state=WaitState.WAITING).count() == 3  # one of them over


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_parallel_requests_never_pass_the_cap(bob, make_token, fleet):
    tokens = [make_token(bob, ["read", "reservations:write"]) for _ in range(8)]
    server = start_server(WAITLIST_MAX_WAITING_PER_USER="4")
    try:
        responses = race(40, lambda i: ("POST", server.url + URL, _body(), tokens[i % 8]))
    finally:
        server.stop()
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 4, 409: 36}, codes
    assert WaitlistEntry.objects.filter(user=bob).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_second_join_waits_for_the_first_to_commit_and_is_refused(bob, fleet, settings):
    settings.WAITLIST_MAX_WAITING_PER_USER = 1
    team = bob.memberships.first().team
    body = _body()
    start, end = datetime.fromisoformat(body["start"]), datetime.fromisoformat(body["end"])

    def join() -> Any:
        return waitlist_join(user=bob, team=team, gpu_model="H100-80GB", gpu_count=1, start=start, end=end)

    out = second_write_while_first_is_open(join, join)
    assert out["second_waited"]  # on bob's row lock
    assert isinstance(out["second"], Conflict) and out["second"].code == "too_many_waiting"
    assert WaitlistEntry.objects.filter(user=bob).count() == 1


@pytest.mark.django_db
def test_a_browser_session_joins_too(bob, fleet):
    # A session's user is a lazy object, not the model: the cap's row lock must not care.
    browser = Client()
    browser.force_login(bob)
    resp = browser.post(URL, _body(), content_type="application/json")
    assert resp.status_code == 201, resp.content
