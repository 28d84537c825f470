"""Sign-in through the login form against Debian's slapd, started by the test with its own directory: users are
created on first sign-in, their teams and their POSIX uid follow the directory from one sign-in to the next, and
local accounts are neither replaced nor taken over."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.accounts.models import Membership, MembershipSource
from apps.accounts.services import membership_set
from apps.identity.models import UnixAccount
from apps.identity.selectors import unix_uids
from apps.identity.services import group_mapping_create, unix_uid_set
from tests.identity.support import Directory, slapd

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def directory() -> Iterator[Directory]:
    with slapd() as d:
        yield d


@pytest.fixture
def ldap_settings(settings: Any, directory: Directory) -> Directory:
    for name, value in directory.portal_env().items():
        setattr(settings, name, value)
    return directory


_n = iter(range(10_000))


def _person(
    directory: Directory,
    password: str = "correct horse battery",  # noqa: S107
    *,
    uid_number: int | None = None,
) -> str:
    uid = f"erin{next(_n)}"
    directory.add_person(uid, password, mail=f"{uid}@lab.test", given="Erin", uid_number=uid_number)
    return uid


def _sign_in(uid: str, password: str = "correct horse battery") -> Client:  # noqa: S107
    client = Client()
    response = client.post("/accounts/login/", {"username": uid, "password": password})
    assert response.status_code == 302, response.content.decode()[:2000]
    return client


def _teams(uid: str) -> dict[str, tuple[str, str]]:
    return {m.team.slug: (m.role, m.source) for m in Membership.objects.filter(user__username=uid)}


def test_first_sign_in_creates_the_user_from_the_directory(ldap_settings: Directory) -> None:
    uid = _person(ldap_settings)
    client = _sign_in(uid)
    user = User.objects.get(username=uid)
    assert (user.email, user.first_name, user.last_name) == (f"{uid}@lab.test", "Erin", "Tester")
    assert not user.has_usable_password()  # the directory keeps the password
    assert client.get("/api/v1/me").json()["username"] == uid


def test_a_wrong_password_is_refused_on_the_form(ldap_settings: Directory) -> None:
    uid = _person(ldap_settings)
    response = Client().post("/accounts/login/", {"username": uid, "password": "wrong"})
    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()
    assert not User.objects.filter(username=uid).exists()


def test_teams_follow_the_directory_groups_between_sign_ins(ldap_settings: Directory, vision: Any, nlp: Any) -> None:
    uid = _person(ldap_settings)
    dn = f"uid={uid},ou=people,dc=lab,dc=test"
    group = f"gpu-vision-{uid}"
    ldap_settings.add_group(group, [dn])
    group_mapping_create(actor=None, group=group, team="vision", role="member")
    # A DN works as the group's name too (as django-auth-ldap reports it: lower case).
    group_mapping_create(actor=None, group=f"cn=leads-{uid},ou=groups,dc=lab,dc=test", team="nlp", role="manager")
    ldap_settings.add_group(f"leads-{uid}", [])

    _sign_in(uid)
    assert _teams(uid) == {"vision": ("member", MembershipSource.DIRECTORY)}

    ldap_settings.set_members(f"leads-{uid}", [dn])
    _sign_in(uid)
    assert _teams(uid) == {
        "vision": ("member", MembershipSource.DIRECTORY),
        "nlp": ("manager", MembershipSource.DIRECTORY),
    }

    ldap_settings.set_members(group, [])
    ldap_settings.set_members(f"leads-{uid}", [])
    _sign_in(uid)
    assert _teams(uid) == {}


def test_posix_groups_map_to_teams_too(ldap_settings: Directory, settings: Any, vision: Any) -> None:
    settings.LDAP_GROUP_TYPE = "posixGroup"
    uid = _person(ldap_settings)
    group = f"vision-posix-{uid}"
    ldap_settings.add_posix_group(group, 5000 + next(_n), [uid])
    group_mapping_create(actor=None, group=group, team="vision", role="manager")
    _sign_in(uid)
    assert _teams(uid) == {"vision": ("manager", MembershipSource.DIRECTORY)}
    ldap_settings.set_posix_members(group, [])
    _sign_in(uid)
    assert _teams(uid) == {}


def test_groups_of_several_object_classes_at_once(
    ldap_settings: Directory, settings: Any, vision: Any, nlp: Any
) -> None:
    settings.LDAP_GROUP_TYPE = "groupOfNames, posixGroup"
    uid = _person(ldap_settings)
    dn = f"uid={uid},ou=people,dc=lab,dc=test"
    names, posix = f"vision-names-{uid}", f"nlp-posix-{uid}"
    ldap_settings.add_group(names, [dn])
    ldap_settings.add_posix_group(posix, 5000 + next(_n), [uid])
    group_mapping_create(actor=None, group=names, team="vision", role="member")
    group_mapping_create(actor=None, group=posix, team="nlp", role="manager")
    _sign_in(uid)
    assert _teams(uid) == {
        "vision": ("member", MembershipSource.DIRECTORY),
        "nlp": ("manager", MembershipSource.DIRECTORY),
    }
    ldap_settings.set_posix_members(posix, [])
    _sign_in(uid)
    assert _teams(uid) == {"vision": ("member", MembershipSource.DIRECTORY)}
    # With one type only, the other kind's groups are not read.
    settings.LDAP_GROUP_TYPE = "posixGroup"
    ldap_settings.set_posix_members(posix, [uid])
    _sign_in(uid)
    assert _teams(uid) == {"nlp": ("manager", MembershipSource.DIRECTORY)}


def test_an_unknown_group_type_stops_the_settings_with_a_clear_error() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "LDAP_GROUP_TYPE": "groupOfNames,nisNetgroup", "DJANGO_SETTINGS_MODULE": "portal.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "LDAP_GROUP_TYPE must be groupOfNames, groupOfUniqueNames or posixGroup" in done.stderr


def test_a_manual_membership_survives_a_sync_unless_the_mapping_replaces_it(
    ldap_settings: Directory, vision: Any, nlp: Any
) -> None:
    uid = _person(ldap_settings)
    _sign_in(uid)
    user = User.objects.get(username=uid)
    membership_set(actor=None, team=vision, user=user, role="manager")
    membership_set(actor=None, team=nlp, user=user, role="member")
    group_mapping_create(actor=None, group=f"unused-{uid}", team="vision", role="member")
    group_mapping_create(actor=None, group=f"unused-{uid}", team="nlp", role="member", replaces_manual=True)

    _sign_in(uid)  # in neither group
    assert _teams(uid) == {"vision": ("manager", MembershipSource.MANUAL)}


def test_a_local_account_is_not_taken_over_by_a_directory_user_of_the_same_name(
    ldap_settings: Directory, admin: Any
) -> None:
    ldap_settings.add_person(admin.username, "directory password", mail="intruder@lab.test")
    response = Client().post("/accounts/login/", {"username": admin.username, "password": "directory password"})
    assert response.status_code == 200  # refused: the form again
    admin.refresh_from_db()
    assert admin.email != "intruder@lab.test" and admin.has_usable_password()


def test_local_accounts_still_sign_in_while_the_directory_is_down(settings: Any, admin: Any) -> None:
    settings.LDAP_SERVER_URI = "ldap://127.0.0.1:1"
    admin.set_password("break-glass-password-1")
    admin.save()
    assert _sign_in(admin.username, "break-glass-password-1").get("/api/v1/me").json()["is_admin"] is True


def _uid_of(username: str) -> int | None:
    user = User.objects.get(username=username)
    return unix_uids([user.pk]).get(user.pk)


def test_the_uid_number_is_stored_at_sign_in_and_follows_the_directory(ldap_settings: Directory) -> None:
    uid = _person(ldap_settings, uid_number=20001)
    _sign_in(uid)
    assert _uid_of(uid) == 20001
    assert UnixAccount.objects.get(user__username=uid).source == "ldap"
    ldap_settings.set_uid_number(uid, 20002)
    _sign_in(uid)
    assert _uid_of(uid) == 20002


def test_the_uid_is_stored_without_a_group_search_too(ldap_settings: Directory, settings: Any) -> None:
    settings.LDAP_GROUP_SEARCH_BASE = ""
    uid = _person(ldap_settings, uid_number=20011)
    _sign_in(uid)
    assert _uid_of(uid) == 20011


def test_a_uid_another_user_holds_is_not_stored_and_the_sign_in_goes_on(
    ldap_settings: Directory, alice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    unix_uid_set(user=alice, uid=20021, source="manual")
    uid = _person(ldap_settings, uid_number=20021)
    with caplog.at_level(logging.WARNING, logger="apps.identity.ldap"):
        client = _sign_in(uid)
    assert client.get("/api/v1/me").json()["username"] == uid
    assert _uid_of(uid) is None
    assert unix_uids([alice.pk]) == {alice.pk: 20021}
    assert any("20021" in r.getMessage() and uid in r.getMessage() for r in caplog.records)


def test_an_entry_without_a_uid_number_leaves_the_uid_alone(ldap_settings: Directory, settings: Any) -> None:
    uid = _person(ldap_settings)  # no posixAccount
    _sign_in(uid)
    assert _uid_of(uid) is None
    unix_uid_set(user=User.objects.get(username=uid), uid=20031, source="manual")
    _sign_in(uid)
    settings.LDAP_UID_ATTR = "sn"  # "Tester": not a number
    _sign_in(uid)
    assert UnixAccount.objects.get(user__username=uid).source == "manual"
    assert _uid_of(uid) == 20031
