"""The POSIX uid of each portal user: the service's refusals (root, out of range, taken: nothing written), one
winner among users racing for one uid, the selector's mapping, and the admin pages that set it by hand."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from apps.audit.models import AuditEvent
from apps.core.errors import ValidationFailed
from apps.identity.models import UnixAccount
from apps.identity.selectors import unix_uids
from apps.identity.services import unix_uid_from_directory, unix_uid_set
from tests.factories import UserFactory


@pytest.mark.django_db
def test_a_uid_is_set_changed_and_removed_with_an_audit_row_each() -> None:
    user = UserFactory(username="erin")
    account = unix_uid_set(user=user, uid=5001, source="manual")
    assert account is not None and (account.uid, account.source) == (5001, "manual")
    unix_uid_set(user=user, uid=5002, source="ldap")
    assert UnixAccount.objects.get(user=user).uid == 5002
    assert unix_uid_set(user=user, uid=None, source="manual") is None
    assert not UnixAccount.objects.exists()
    assert [(e.action, e.data) for e in AuditEvent.objects.order_by("pk")] == [
        ("unix_account.set", {"uid": 5001, "previous": None, "source": "manual"}),
        ("unix_account.set", {"uid": 5002, "previous": 5001, "source": "ldap"}),
        ("unix_account.delete", {"uid": 5002}),
    ]


@pytest.mark.django_db
def test_a_directorys_value_is_taken_when_it_is_a_number_and_free(caplog: Any) -> None:
    user = UserFactory(username="fay")
    UnixAccount.objects.create(user=UserFactory(username="gus"), uid=7002)
    for value, expected in ((7001, 7001), (b"7003", 7003), (" 7004 ", 7004), (None, 7004), (True, 7004),
                            ("fay", 7004), ([7005], 7004), (0, 7004), (7002, 7004)):  # fmt: skip
        unix_uid_from_directory(user=user, value=value, source="oidc")
        assert UnixAccount.objects.get(user=user).uid == expected, value
    assert "uid 7002 not stored" in caplog.text and "uid 0 not stored" in caplog.text


@pytest.mark.django_db
def test_setting_the_same_uid_again_writes_nothing() -> None:
    user = UserFactory(username="erin")
    first = unix_uid_set(user=user, uid=5001, source="ldap")
    again = unix_uid_set(user=user, uid=5001, source="ldap")
    assert first is not None and again is not None and again.updated_at == first.updated_at
    assert AuditEvent.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("uid", [0, -1, 2**32 - 1, 2**32, 2**40])
def test_root_negative_and_too_large_uids_are_refused_and_nothing_is_written(uid: int) -> None:
    user = UserFactory(username="erin")
    with pytest.raises(ValidationFailed) as refused:
        unix_uid_set(user=user, uid=uid, source="manual")
    assert "uid" in refused.value.fields
    assert not UnixAccount.objects.exists() and not AuditEvent.objects.exists()


@pytest.mark.django_db
def test_the_highest_uid_below_the_kernels_no_uid_is_kept() -> None:
    account = unix_uid_set(user=UserFactory(username="erin"), uid=2**32 - 2, source="manual")
    assert account is not None
    account.refresh_from_db()
    assert account.uid == 2**32 - 2


@pytest.mark.django_db
def test_a_uid_another_user_holds_is_refused_and_nothing_is_written() -> None:
    holder, other = UserFactory(username="holder"), UserFactory(username="other")
    unix_uid_set(user=holder, uid=5001, source="manual")
    unix_uid_set(user=other, uid=5002, source="manual")
    with pytest.raises(ValidationFailed) as refused:
        unix_uid_set(user=other, uid=5001, source="ldap")
    assert refused.value.fields == {"uid": ["Taken by another user."]}
    assert unix_uids([holder.pk, other.pk]) == {holder.pk: 5001, other.pk: 5002}
    assert AuditEvent.objects.count() == 2


@pytest.mark.django_db
def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValidationFailed):
        unix_uid_set(user=UserFactory(username="erin"), uid=5001, source="nss")
    assert not UnixAccount.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_users_racing_for_one_uid_on_postgres_have_exactly_one_winner() -> None:
    users = [UserFactory(username=f"racer{i}") for i in range(20)]
    barrier = threading.Barrier(len(users))
    wins: list[int] = []
    refusals: list[int] = []
    errors: list[BaseException] = []

    def race(user: Any) -> None:
        try:
            barrier.wait()
            unix_uid_set(user=user, uid=7000, source="manual")
            wins.append(user.pk)
        except ValidationFailed:
            refusals.append(user.pk)
        except BaseException as exc:  # an IntegrityError here would be the bug this test is for
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(wins) == 1 and len(refusals) == len(users) - 1
    assert list(UnixAccount.objects.values_list("user_id", "uid")) == [(wins[0], 7000)]
    assert AuditEvent.objects.filter(action="unix_account.set").count() == 1


@pytest.mark.django_db
def test_the_selector_maps_user_ids_to_uids_in_one_query(django_assert_num_queries: Any) -> None:
    a, b, c = (UserFactory(username=name) for name in ("a", "b", "c"))
    unix_uid_set(user=a, uid=5001, source="manual")
    unix_uid_set(user=b, uid=5002, source="ldap")
    with django_assert_num_queries(1):
        assert unix_uids(iter([a.pk, b.pk, c.pk])) == {a.pk: 5001, b.pk: 5002}
    assert unix_uids([]) == {}


@pytest.mark.django_db
def test_the_admin_adds_a_uid_refuses_root_and_a_taken_one_and_searches_by_uid(admin: Any) -> None:
    erin, zoltan = UserFactory(username="erin"), UserFactory(username="zoltan")
    unix_uid_set(user=zoltan, uid=5001, source="ldap")
    client = Client()
    client.force_login(admin)
    for refused_uid in (0, 5001):
        response = client.post(
            "/admin/identity/unixaccount/add/", {"user": erin.pk, "uid": refused_uid, "source": "manual"}
        )
        assert response.status_code == 200  # the form again, with the error on the uid
        assert list(response.context["adminform"].form.errors) == ["uid"]
    assert not UnixAccount.objects.filter(user=erin).exists()
    response = client.post("/admin/identity/unixaccount/add/", {"user": erin.pk, "uid": 5002, "source": "manual"})
    assert response.status_code == 302
    assert unix_uids([erin.pk]) == {erin.pk: 5002}
    assert AuditEvent.objects.get(action="unix_account.set", data__uid=5002).actor_id == admin.pk
    account = UnixAccount.objects.get(user=erin)
    response = client.post(f"/admin/identity/unixaccount/{account.pk}/change/", {"uid": 5003, "source": "manual"})
    assert response.status_code == 302
    assert unix_uids([erin.pk, zoltan.pk]) == {erin.pk: 5003, zoltan.pk: 5001}
    listing = client.get("/admin/identity/unixaccount/", {"q": "5002"}).content.decode()
    assert "erin" in listing and "zoltan" not in listing
    listing = client.get("/admin/identity/unixaccount/", {"q": "zolt"}).content.decode()
    assert "zoltan" in listing and "erin" not in listing
