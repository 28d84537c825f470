"""POSIX uids in bulk over the REST API (`/api/v1/unix-accounts/`, admin scope): a load is all or nothing, uids may
move between the users it lists (a swap is one request), a uid held by someone not listed is refused, every change
is audited, and real parallel requests for one uid leave one holder."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.identity.models import UnixAccount
from apps.identity.services import unix_uid_set
from tests.booking.test_concurrency import race, start_server
from tests.conftest import LiveServer
from tests.factories import UserFactory

URL = "/api/v1/unix-accounts/"


def _uids() -> dict[str, tuple[int, str]]:
    return {a.user.username: (a.uid, a.source) for a in UnixAccount.objects.select_related("user")}


@pytest.mark.django_db
def test_an_admin_loads_lists_swaps_and_removes_uids(admin: Any, alice: Any, bob: Any, api_as: Any) -> None:
    api = api_as(admin)
    unix_uid_set(user=bob, uid=2002, source="ldap")
    resp = api.post(URL, {"accounts": [{"user": "alice", "uid": 2001}, {"user": "bob", "uid": 2002}]}, format="json")
    assert resp.status_code == 200, resp.json()
    # bob's uid stays, but it is now the admin's word rather than the directory's: a change, audited.
    assert resp.json()["changed"] == 2
    assert [(a["user"], a["uid"], a["source"]) for a in resp.json()["accounts"]] == [
        ("alice", 2001, "manual"),
        ("bob", 2002, "manual"),
    ]
    assert [a["user"] for a in api.get(URL).json()] == ["alice", "bob"]
    again = api.post(URL, {"accounts": [{"user": "alice", "uid": 2001}]}, format="json")
    assert again.status_code == 200 and again.json()["changed"] == 0
    swap = api.post(URL, {"accounts": [{"user": "alice", "uid": 2002}, {"user": "bob", "uid": 2001}]}, format="json")
    assert swap.status_code == 200, swap.json()
    assert _uids() == {"alice": (2002, "manual"), "bob": (2001, "manual")}
    removed = api.post(URL, {"accounts": [{"user": "bob", "uid": None}]}, format="json")
    assert removed.status_code == 200 and removed.json() == {"changed": 1, "skipped": [], "accounts": []}
    assert _uids() == {"alice": (2002, "manual")}
    events = [(e.action, e.data) for e in AuditEvent.objects.filter(action__startswith="unix_account").order_by("pk")]
    assert events == [
        ("unix_account.set", {"uid": 2002, "previous": None, "source": "ldap"}),
        ("unix_account.set", {"uid": 2001, "previous": None, "source": "manual"}),
        ("unix_account.set", {"uid": 2002, "previous": 2002, "source": "manual"}),
        ("unix_account.set", {"uid": 2002, "previous": 2001, "source": "manual"}),
        ("unix_account.set", {"uid": 2001, "previous": 2002, "source": "manual"}),
        ("unix_account.delete", {"uid": 2001}),
    ]
    assert AuditEvent.objects.filter(action="unix_account.set", actor=admin).count() == 4


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("accounts", "says"),
    [
        ([{"user": "alice", "uid": 3001}, {"user": "nobody-here", "uid": 3002}], "No such user: nobody-here."),
        ([{"user": "alice", "uid": 3001}, {"user": "bob", "uid": 3001}], "Each uid at most once: 3001."),
        ([{"user": "alice", "uid": 3001}, {"user": "alice", "uid": 3002}], "Each user at most once: alice."),
        ([{"user": "alice", "uid": 3001}, {"user": "bob", "uid": 1003}], "not in this request: uid 1003."),
    ],
)
def test_a_load_with_any_bad_entry_changes_nothing(
    admin: Any, alice: Any, bob: Any, api_as: Any, accounts: list[dict[str, Any]], says: str
) -> None:
    unix_uid_set(user=UserFactory(username="carol"), uid=1003, source="manual")
    before = _uids()
    resp = api_as(admin).post(URL, {"accounts": accounts}, format="json")
    assert resp.status_code == 400, resp.json()
    body = resp.json()
    assert body["code"] == "invalid" and says in body["detail"] and body["fields"]["accounts"]
    assert _uids() == before
    assert AuditEvent.objects.filter(action__startswith="unix_account", actor=admin).count() == 0


@pytest.mark.django_db
def test_a_nodes_whole_account_list_loads_with_unknown_users_skipped(admin: Any, alice: Any, api_as: Any) -> None:
    """A passwd file's users are mostly no portal user: `skip_unknown_users` leaves them out and says which."""
    accounts = [{"user": "alice", "uid": 1001}] + [{"user": f"svc{i}", "uid": 5000 + i} for i in range(3000)]
    resp = api_as(admin).post(URL, {"accounts": accounts, "skip_unknown_users": True}, format="json")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["changed"] == 1 and len(resp.json()["skipped"]) == 3000 and "svc0" in resp.json()["skipped"]
    assert _uids() == {"alice": (1001, "manual")}
    # Without it, the same list is refused whole.
    accounts[0]["uid"] = 1002
    refused = api_as(admin).post(URL, {"accounts": accounts}, format="json")
    assert refused.status_code == 400 and refused.json()["detail"].endswith(" and 2980 more.")
    assert _uids() == {"alice": (1001, "manual")}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload",
    [
        {"accounts": [{"user": "alice", "uid": 0}]},
        {"accounts": [{"user": "alice", "uid": -5}]},
        {"accounts": [{"user": "alice", "uid": 2**32 - 1}]},
        {"accounts": [{"user": "alice", "uid": "root"}]},
        {"accounts": [{"user": "alice"}]},
        {"accounts": []},
        {"accounts": "alice=1001"},
        {},
    ],
)
def test_malformed_loads_get_field_errors(admin: Any, alice: Any, api_as: Any, payload: dict[str, Any]) -> None:
    resp = api_as(admin).post(URL, payload, format="json")
    assert resp.status_code == 400 and resp.json()["code"] == "invalid" and "accounts" in resp.json()["fields"]
    assert not UnixAccount.objects.exists()


@pytest.mark.django_db
def test_only_administrators_see_or_set_uids(alice: Any, api_as: Any, admin: Any) -> None:
    assert api_as(alice).get(URL).status_code == 403
    body = {"accounts": [{"user": "alice", "uid": 4001}]}
    assert api_as(alice).post(URL, body, format="json").status_code == 403
    assert api_as(admin, scopes=["read"]).post(URL, body, format="json").status_code == 403
    assert not UnixAccount.objects.exists()


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_parallel_loads_giving_one_uid_to_different_users_leave_one_holder(
    admin: Any, make_token: Any, racing_portal: LiveServer
) -> None:
    users = [UserFactory(username=f"racer{i}") for i in range(12)]
    token = make_token(admin, ["read", "admin"])
    # Each load also gives its user a uid of their own, so a loser that half-wrote would show.
    responses = race(
        len(users),
        lambda i: (
            "POST",
            racing_portal.url + URL,
            {"accounts": [{"user": users[i].username, "uid": 9000}, {"user": f"racer{(i + 1) % 12}", "uid": 9100 + i}]},
            token,
        ),
    )
    codes = Counter(r.status_code for r in responses)
    assert set(codes) <= {200, 400} and codes[200] >= 1, codes
    assert all(r.json()["code"] == "invalid" for r in responses if r.status_code == 400)
    holders = list(UnixAccount.objects.filter(uid=9000).values_list("user__username", flat=True))
    assert len(holders) == 1
    # Every account present was written by a load that answered 200 (all or nothing): its partner uid is there too.
    winners = [r.json()["accounts"] for r in responses if r.status_code == 200]
    written = {(a["user"], a["uid"]) for accounts in winners for a in accounts}
    assert set(UnixAccount.objects.values_list("user__username", "uid")) <= written
    assert len(set(UnixAccount.objects.values_list("uid", flat=True))) == UnixAccount.objects.count()
