"""The web process's cache of token and team rows (apps/core/rowcache.py): served without a query while nothing
changed, dropped on every change PostgreSQL reports (also changes made behind the ORM's back), bypassed whenever it
cannot be trusted. PostgreSQL only (LISTEN/NOTIFY); committed data (notifications are sent at commit)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts import services as account_services
from apps.accounts.authentication import authenticate_token
from apps.accounts.models import ApiToken, Membership, Team
from apps.booking.selectors import team_for_booking
from apps.core import rowcache
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _until(check: Callable[[], bool], timeout: float = 10.0) -> float:
    """Seconds until `check()` held; fails the test after `timeout`."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"not within {timeout} s")
        time.sleep(0.005)
    return time.monotonic() - t0


@pytest.fixture
def cache(settings: Any) -> Iterator[Any]:
    settings.DB_ROW_CACHE = True
    rowcache.reset()
    listener = rowcache.listener()
    assert listener is not None
    _until(lambda: listener.generation() is not None)
    yield listener
    rowcache.reset()


def _settle(cache: Any) -> None:
    """Wait until every notification committed so far has reached the listener (they arrive in commit order)."""
    marker = f"marker-{time.monotonic_ns()}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [rowcache.CHANNEL, marker])
    _until(lambda: cache.last_payload == marker)


def _queries(fn: Callable[[], Any]) -> int:
    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured)


def _refused(plaintext: str) -> str | None:
    try:
        authenticate_token(plaintext)
    except AuthenticationFailed as exc:
        return str(exc.detail)
    return None


def test_a_token_is_looked_up_once_then_revocation_reaches_the_cache(cache: Any, alice: Any, make_token: Any) -> None:
    plaintext = make_token(alice, ["read"])
    _settle(cache)
    authenticate_token(plaintext)  # read (and last_used_at written)
    assert _queries(lambda: authenticate_token(plaintext)) == 0
    user, token = authenticate_token(plaintext)
    assert user.pk == alice.pk and token.scopes == ["read"]

    account_services.token_revoke(user=alice, token_id=token.pk)
    took = _until(lambda: _refused(plaintext) == "Token has been revoked.")
    assert took < 5


def test_changes_behind_the_orms_back_reach_the_cache(cache: Any, alice: Any, make_token: Any) -> None:
    """A QuerySet.update() sends no Django signal; the trigger still tells every process."""
    plaintext = make_token(alice, ["read"])
    _settle(cache)
    authenticate_token(plaintext)
    assert _queries(lambda: authenticate_token(plaintext)) == 0
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)
    _until(lambda: _refused(plaintext) == "User is inactive.")
    type(alice).objects.filter(pk=alice.pk).update(is_active=True)
    _until(lambda: _refused(plaintext) is None)
    # An administrator's SQL, in a connection of its own.
    with psycopg.connect(**_params(), autocommit=True) as other:
        other.execute(
            "UPDATE accounts_apitoken SET expires_at = now() - interval '1 day' WHERE user_id = %s", [alice.pk]
        )
    _until(lambda: _refused(plaintext) == "Token has expired.")


def _params() -> dict[str, Any]:
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    return params


def test_bookkeeping_writes_do_not_empty_the_cache(cache: Any, alice: Any, make_token: Any, vision: Any) -> None:
    plaintext = make_token(alice, ["read"])
    _, token = authenticate_token(plaintext)
    _settle(cache)
    before = cache.notifications
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    type(alice).objects.filter(pk=alice.pk).update(last_login=timezone.now())
    Team.objects.filter(pk=vision.pk).update(name="Vision, renamed")  # a real change, after them
    _settle(cache)  # every notification of the three updates has arrived by now
    assert cache.notifications == before + 2  # the rename's and the marker's


def test_membership_changes_reach_the_team_lookup(cache: Any, alice: Any, nlp: Any) -> None:
    _settle(cache)
    assert team_for_booking(slug="nlp", user=alice).is_member is False
    assert _queries(lambda: team_for_booking(slug="nlp", user=alice)) == 0
    MembershipFactory(user=alice, team=nlp)
    _until(lambda: team_for_booking(slug="nlp", user=alice).is_member is True)
    Membership.objects.filter(user=alice, team=nlp).delete()
    _until(lambda: team_for_booking(slug="nlp", user=alice).is_member is False)
    # Each caller gets an instance of its own (nothing shared between requests).
    assert team_for_booking(slug="nlp", user=alice) is not team_for_booking(slug="nlp", user=alice)


def test_inside_a_transaction_the_database_is_asked(cache: Any, alice: Any, vision: Any) -> None:
    _settle(cache)
    team_for_booking(slug="vision", user=alice)
    assert _queries(lambda: team_for_booking(slug="vision", user=alice)) == 0
    with transaction.atomic():
        Membership.objects.filter(user=alice, team=vision).delete()  # not committed: no notification yet
        assert team_for_booking(slug="vision", user=alice).is_member is False
        transaction.set_rollback(True)
    assert team_for_booking(slug="vision", user=alice).is_member is True


def test_a_lost_listener_connection_empties_the_cache_and_reconnects(cache: Any, alice: Any, make_token: Any) -> None:
    plaintext = make_token(alice, ["read"])
    _settle(cache)
    authenticate_token(plaintext)
    assert _queries(lambda: authenticate_token(plaintext)) == 0
    made = cache.connections
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'portal-rowcache' "
            "AND datname = current_database()"
        )
    _until(lambda: cache.connections > made and cache.generation() is not None)  # reconnected and heard again
    assert _queries(lambda: authenticate_token(plaintext)) == 1  # emptied: read again
    assert _queries(lambda: authenticate_token(plaintext)) == 0


class _Deaf:
    """A connection on which LISTEN is accepted and nothing is ever delivered: what a pooler in transaction mode
    (PgBouncer) amounts to."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __enter__(self) -> _Deaf:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._conn.close()

    def execute(self, sql: str, params: Any = None) -> Any:
        return self._conn.execute("SELECT 1" if sql.startswith("LISTEN") else sql, params)

    def notifies(self, timeout: float) -> Any:
        return self._conn.notifies(timeout=timeout)


def test_a_listener_that_hears_nothing_is_never_trusted(
    settings: Any, monkeypatch: Any, alice: Any, make_token: Any
) -> None:
    settings.DB_ROW_CACHE = True
    rowcache.reset()
    real_connect = rowcache._Listener._connect
    monkeypatch.setattr(rowcache._Listener, "_connect", lambda self: _Deaf(real_connect(self)))
    try:
        listener = rowcache.listener()
        assert listener is not None
        _until(lambda: listener.connections == 1)
        time.sleep(2 * rowcache.POLL_S)  # its first heartbeat went out at once and never came back
        assert listener.generation() is None
        plaintext = make_token(alice, ["read"])
        authenticate_token(plaintext)
        assert _queries(lambda: authenticate_token(plaintext)) == 1
    finally:
        rowcache.reset()


def test_off_unless_enabled(settings: Any, alice: Any, make_token: Any) -> None:
    settings.DB_ROW_CACHE = False
    rowcache.reset()
    plaintext = make_token(alice, ["read"])
    authenticate_token(plaintext)
    assert rowcache.listener() is None
    assert _queries(lambda: authenticate_token(plaintext)) == 1


def test_the_web_process_serves_from_the_cache_and_sees_revocation(
    live_portal: Any, alice: Any, make_token: Any
) -> None:
    """Against uvicorn serving portal.asgi (the cache on, as shipped). With the triggers disabled, a revoked
    token still works there: proof that the server answers from its cache. Enabled again, the next change to
    the row reaches it."""
    plaintext = make_token(alice, ["read"])

    def status() -> int:
        req = urllib.request.Request(live_portal.url + "/api/v1/me", headers={"Authorization": f"Bearer {plaintext}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    _until(lambda: status() == 200)  # the listener connects at the first lookup; then the row is cached
    for _ in range(5):
        assert status() == 200
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE accounts_apitoken DISABLE TRIGGER USER")
    try:
        ApiToken.objects.filter(user=alice).update(revoked_at=timezone.now())
        time.sleep(0.5)
        assert status() == 200  # served from the cache: nobody told the process
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE accounts_apitoken ENABLE TRIGGER USER")
    ApiToken.objects.filter(user=alice).update(name="touched")
    took = _until(lambda: status() == 401)
    assert took < 5
