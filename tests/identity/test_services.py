"""The identity services on the database: accounts for provider subjects, and the sync's writes and audit rows."""

from __future__ import annotations

from typing import Any

import pytest

from apps.accounts.models import Membership, MembershipSource
from apps.accounts.services import membership_set
from apps.audit.models import AuditEvent
from apps.identity.models import ExternalIdentity
from apps.identity.services import directory_sync, group_mapping_create, oidc_user_sign_in
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
ISSUER = "https://id.lab.test"


def test_a_subject_gets_one_account_and_its_details_follow_the_provider() -> None:
    first = oidc_user_sign_in(issuer=ISSUER, claims={"sub": "s-1", "preferred_username": "dana", "email": "d@x.org"})
    again = oidc_user_sign_in(
        issuer=ISSUER, claims={"sub": "s-1", "preferred_username": "dana", "email": "dana@lab.test", "given_name": "D"}
    )
    assert first.pk == again.pk and again.username == "dana"
    again.refresh_from_db()
    assert (again.email, again.first_name) == ("dana@lab.test", "D")
    assert not again.has_usable_password()


def test_the_same_subject_at_another_issuer_is_another_person() -> None:
    a = oidc_user_sign_in(issuer=ISSUER, claims={"sub": "s-1", "preferred_username": "dana"})
    b = oidc_user_sign_in(issuer="https://other.test", claims={"sub": "s-1", "preferred_username": "dana"})
    assert a.pk != b.pk and b.username == "dana-2"
    assert ExternalIdentity.objects.count() == 2


def test_a_taken_user_name_gets_a_suffix_and_odd_characters_are_replaced() -> None:
    UserFactory(username="bob")
    UserFactory(username="bob-2")
    assert oidc_user_sign_in(issuer=ISSUER, claims={"sub": "x", "preferred_username": "Bob"}).username == "Bob-3"
    assert oidc_user_sign_in(issuer=ISSUER, claims={"sub": "y", "email": "o'neil x@lab.test"}).username == "o-neil-x"


def test_the_sync_writes_sources_and_audits_each_change(vision: Any, nlp: Any) -> None:
    user = UserFactory(username="erin")
    membership_set(actor=None, team=nlp, user=user, role="member")
    group_mapping_create(actor=None, group="g-vision", team="vision", role="manager")
    plan = directory_sync(user=user, groups=["g-vision"], via="oidc")
    assert plan.add == {vision.pk: "manager"}
    rows = {m.team.slug: (m.role, m.source) for m in Membership.objects.filter(user=user)}
    assert rows == {"vision": ("manager", MembershipSource.DIRECTORY), "nlp": ("member", MembershipSource.MANUAL)}
    event = AuditEvent.objects.get(action="membership.directory_add")
    assert event.data == {"via": "oidc", "role": "manager", "groups": ["g-vision"]}
    assert directory_sync(user=user, groups=["g-vision"], via="oidc").empty  # nothing more to do
    directory_sync(user=user, groups=[], via="ldap")
    assert AuditEvent.objects.filter(action="membership.directory_remove").count() == 1
    assert list(Membership.objects.filter(user=user).values_list("team__slug", flat=True)) == ["nlp"]


def test_setting_a_directory_membership_by_hand_makes_it_manual(vision: Any) -> None:
    user = UserFactory(username="erin")
    group_mapping_create(actor=None, group="g-vision", team="vision")
    directory_sync(user=user, groups=["g-vision"], via="oidc")
    membership_set(actor=None, team=vision, user=user, role="manager")
    directory_sync(user=user, groups=[], via="oidc")
    assert Membership.objects.get(user=user).source == MembershipSource.MANUAL


def test_the_settings_page_says_where_each_membership_comes_from(vision: Any, nlp: Any) -> None:
    from django.test import Client

    user = UserFactory(username="erin")
    membership_set(actor=None, team=nlp, user=user, role="member")
    group_mapping_create(actor=None, group="g-vision", team="vision")
    directory_sync(user=user, groups=["g-vision"], via="ldap")
    client = Client()
    client.force_login(user)
    html = client.get("/accounts/settings/").content.decode()
    rows = {row.split("</td>")[0].split(" — ")[0].split(">")[-1]: row for row in html.split("<tr><td>")[1:]}
    assert "your directory groups" in rows["vision"] and "added by hand" in rows["nlp"]


def test_the_settings_page_says_which_uid_the_users_processes_run_as(vision: Any) -> None:
    from django.test import Client

    from apps.identity.models import UnixAccount

    user = UserFactory(username="frank")
    client = Client()
    client.force_login(user)
    assert "does not know the uid your processes run as" in client.get("/accounts/settings/").content.decode()
    UnixAccount.objects.create(user=user, uid=40123, source="ldap")
    html = client.get("/accounts/settings/").content.decode()
    assert "your processes run as uid <strong>40123</strong> (the directory&#x27;s uidNumber at sign-in)" in html
