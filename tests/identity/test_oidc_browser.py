"""Single sign-on in headless Chromium: the portal (uvicorn, its own process) against an OpenID provider (its own
process, tests/identity/oidc_provider.py) on loopback. A new user lands in the team their group maps to and loses it
when the group goes; a wrong client secret, an expired or tampered ID token and an unknown issuer each end on an
error page, with no account created."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

import jwt
import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.accounts.models import Membership, MembershipSource
from apps.identity.models import ExternalIdentity, GroupMapping, UnixAccount
from apps.identity.oidc import _discover
from tests.factories import TeamFactory, UserFactory
from tests.identity.support import oidc_portal, oidc_provider

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")


@contextmanager
def browser_page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.set_default_timeout(30_000)
            yield context.new_page()
        finally:
            browser.close()


def sign_in_through_provider(page: Any, portal_url: str, sub: str) -> None:
    """The person's path: the portal's sign-in page, the provider's button, the provider's form."""
    page.goto(portal_url + "/accounts/login/")
    page.click("#oidc-sign-in")
    page.wait_for_url("**/oauth2/authorize**")
    page.fill("input[name=sub]", sub)
    page.click("form:has(input[name=sub]) button[type=submit]")
    page.wait_for_url(lambda url: url.startswith(portal_url))
    page.wait_for_load_state()


def _teams(username: str) -> dict[str, tuple[str, str]]:
    return {m.team.slug: (m.role, m.source) for m in Membership.objects.filter(user__username=username)}


@needs_chromium
def test_a_new_user_signs_in_joins_the_mapped_team_and_leaves_it_when_the_group_goes(transactional_db: Any) -> None:
    vision = TeamFactory(slug="vision", name="Vision")
    GroupMapping.objects.create(group="/lab/gpu-vision", team=vision, role="member")
    with oidc_provider() as provider, oidc_portal(provider) as portal:
        provider.set_user(
            "dana-sub", preferred_username="dana", email="dana@lab.test", groups=["/lab/gpu-vision", "/lab/all"]
        )
        with browser_page() as page:
            assert "Sign in with Lab SSO" in page.goto(portal.url + "/accounts/login/").text()
            sign_in_through_provider(page, portal.url, "dana-sub")
            assert page.url == portal.url + "/"
            me = page.request.get(portal.url + "/api/v1/me").json()
            assert me["username"] == "dana" and me["email"] == "dana@lab.test"
            assert [(t["team"]["slug"], t["role"]) for t in me["teams"]] == [("vision", "member")]
        assert _teams("dana") == {"vision": ("member", MembershipSource.DIRECTORY)}
        link = ExternalIdentity.objects.get(user__username="dana")
        assert (link.issuer, link.subject) == (provider.url, "dana-sub")

        # The directory drops her from the group; at her next sign-in the portal drops her from the team.
        provider.set_user("dana-sub", preferred_username="dana", email="dana@lab.test", groups=["/lab/all"])
        with browser_page() as page:
            sign_in_through_provider(page, portal.url, "dana-sub")
            assert page.request.get(portal.url + "/api/v1/me").json()["teams"] == []
        assert _teams("dana") == {}
        assert User.objects.filter(username="dana").count() == 1  # the same account both times


@needs_chromium
def test_the_uid_claim_gives_the_user_their_posix_uid(transactional_db: Any) -> None:
    """With OIDC_UID_CLAIM set, each sign-in stores the uid the provider sends (a number or its digits); a claim
    that is no number, or a uid another portal user holds, leaves the account as it was and the sign-in goes on."""
    other = UserFactory(username="olaf")
    UnixAccount.objects.create(user=other, uid=4243)
    with oidc_provider() as provider, oidc_portal(provider, OIDC_UID_CLAIM="uid_number") as portal:
        for claim, expected in ((4242, 4242), ("4244", 4244), ("dana", 4244), (4243, 4244)):
            provider.set_user("dana-sub", preferred_username="dana", email="dana@lab.test", uid_number=claim)
            with browser_page() as page:
                sign_in_through_provider(page, portal.url, "dana-sub")
                assert page.request.get(portal.url + "/api/v1/me").json()["username"] == "dana"
            account = UnixAccount.objects.get(user__username="dana")
            assert (account.uid, account.source) == (expected, "oidc")
    assert UnixAccount.objects.get(user=other).uid == 4243


@needs_chromium
def test_a_provider_user_never_takes_over_a_local_account_with_the_same_email(transactional_db: Any) -> None:
    local = UserFactory(username="root", email="root@lab.test", is_staff=True)
    with oidc_provider() as provider, oidc_portal(provider) as portal:
        provider.set_user("mallory", preferred_username="root", email="root@lab.test", groups=[])
        with browser_page() as page:
            sign_in_through_provider(page, portal.url, "mallory")
            me = page.request.get(portal.url + "/api/v1/me").json()
    assert me["id"] != local.pk and me["username"] == "root-2" and me["is_admin"] is False


@needs_chromium
def test_signing_out_ends_the_providers_session_too_and_comes_back_to_sign_in(transactional_db: Any) -> None:
    with oidc_provider() as provider, oidc_portal(provider) as portal:
        provider.set_user("dana-sub", preferred_username="dana", email="dana@lab.test", groups=[])
        with browser_page() as page:
            sign_in_through_provider(page, portal.url, "dana-sub")
            assert page.request.get(portal.url + "/api/v1/me").status == 200
            page.click("text=Sign out")
            page.wait_for_url("**/oauth2/end_session**")
            query = parse_qs(urlparse(page.url).query)
            assert query["post_logout_redirect_uri"] == [portal.url + "/accounts/login/"]
            # The hint is the ID token the provider issued at sign-in: it names dana and the portal's client.
            claims = jwt.decode(query["id_token_hint"][0], options={"verify_signature": False})
            assert claims["sub"] == "dana-sub" and claims["aud"] in (query["client_id"][0], query["client_id"])
            assert page.request.get(portal.url + "/api/v1/me").status == 401  # out of the portal already
            page.click("button:has-text('End session')")
            page.wait_for_url(portal.url + "/accounts/login/")
            assert page.locator("#oidc-sign-in").count() == 1


@needs_chromium
def test_signing_out_stays_local_when_the_admin_says_so(transactional_db: Any) -> None:
    with oidc_provider() as provider, oidc_portal(provider, OIDC_SIGN_OUT_AT_PROVIDER="false") as portal:
        provider.set_user("dana-sub", preferred_username="dana", email="dana@lab.test", groups=[])
        with browser_page() as page:
            sign_in_through_provider(page, portal.url, "dana-sub")
            page.click("text=Sign out")
            page.wait_for_url(portal.url + "/accounts/login/")
            assert page.request.get(portal.url + "/api/v1/me").status == 401


def test_a_local_account_signs_out_without_the_provider(db: Any, settings: Any) -> None:
    settings.OIDC_ISSUER_URL, settings.OIDC_CLIENT_ID = "http://127.0.0.1:9/", "portal"  # nothing listens there
    client = Client()
    client.force_login(UserFactory(username="erin"))
    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    # Even with an ID token in the session, an unreachable provider does not hold the sign-out up.
    client.force_login(UserFactory(username="fay"))
    session = client.session
    session["oidc_id_token"] = "header.payload.signature"
    session.save()
    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert "_auth_user_id" not in client.session


FAILURES = [
    pytest.param({}, {"client_secret": "not-the-secret"}, "client credentials", id="wrong-client-secret"),
    pytest.param({"token_max_age": -300}, {}, "ID token has expired", id="expired-id-token"),
    pytest.param({"mode": "tamper"}, {}, "signature does not verify", id="tampered-id-token"),
    pytest.param({"mode": "foreign-issuer"}, {}, "unknown issuer", id="unknown-issuer"),
]


@needs_chromium
@pytest.mark.parametrize(("provider_args", "portal_args", "message"), FAILURES)
def test_a_bad_sign_in_ends_on_an_error_page_and_creates_no_account(
    transactional_db: Any, provider_args: dict[str, Any], portal_args: dict[str, Any], message: str
) -> None:
    vision = TeamFactory(slug="vision", name="Vision")
    GroupMapping.objects.create(group="gpu-vision", team=vision, role="manager")
    users_before = User.objects.count()
    with oidc_provider(**provider_args) as provider, oidc_portal(provider, **portal_args) as portal:
        provider.set_user("eve-sub", preferred_username="eve", email="eve@lab.test", groups=["gpu-vision"])
        with browser_page() as page:
            sign_in_through_provider(page, portal.url, "eve-sub")
            assert "/accounts/oidc/callback/" in page.url
            assert page.locator("h1").text_content() == "Sign-in failed"
            assert message in (page.locator("#sign-in-error").text_content() or "")
            assert page.request.get(portal.url + "/api/v1/me").status == 401  # not signed in
    assert User.objects.count() == users_before
    assert not ExternalIdentity.objects.exists() and not Membership.objects.exists()


@needs_chromium
def test_refusing_at_the_provider_ends_on_an_error_page(transactional_db: Any) -> None:
    with oidc_provider() as provider, oidc_portal(provider) as portal, browser_page() as page:
        page.goto(portal.url + "/accounts/login/")
        page.click("#oidc-sign-in")
        page.click("button[value=deny]")
        page.wait_for_url(lambda url: url.startswith(portal.url))
        assert "declined at the sign-in provider" in (page.locator("#sign-in-error").text_content() or "")
        assert page.request.get(portal.url + "/api/v1/me").status == 401
    assert not ExternalIdentity.objects.exists()


def test_a_provider_error_shows_its_code_and_never_text_from_the_link(db: Any) -> None:
    page = Client().get("/accounts/oidc/callback/", {"error": "server_error", "error_description": "Call +1 555"})
    assert page.status_code == 400 and "answered with server_error" in page.content.decode()
    assert "555" not in page.content.decode()
    odd = Client().get("/accounts/oidc/callback/", {"error": "<b>Call us</b>"})
    assert "answered with an error" in odd.content.decode() and "Call us" not in odd.content.decode()


def test_a_discovery_document_naming_another_issuer_is_refused(db: Any, settings: Any) -> None:
    with oidc_provider(mode="discovery-issuer") as provider:
        settings.OIDC_ISSUER_URL = provider.url
        settings.OIDC_CLIENT_ID = "portal"
        _discover.cache_clear()
        try:
            response = Client().get("/accounts/oidc/start/")
        finally:
            _discover.cache_clear()
    assert response.status_code == 503
    assert "names a different issuer" in response.content.decode()


def test_an_unreachable_provider_is_an_error_page_and_local_sign_in_still_works(
    db: Any, settings: Any, admin: Any
) -> None:
    settings.OIDC_ISSUER_URL = "http://127.0.0.1:1"
    settings.OIDC_CLIENT_ID = "portal"
    _discover.cache_clear()
    response = Client().get("/accounts/oidc/start/")
    assert response.status_code == 503 and "could not be read" in response.content.decode()
    admin.set_password("break-glass-password-1")
    admin.save()
    client = Client()
    assert (
        client.post("/accounts/login/", {"username": admin.username, "password": "break-glass-password-1"}).status_code
        == 302
    )


def test_the_login_page_offers_single_sign_on_only_when_configured(db: Any, settings: Any) -> None:
    settings.OIDC_ISSUER_URL = ""
    assert "Sign in with" not in Client().get("/accounts/login/").content.decode()
    settings.OIDC_ISSUER_URL = "https://id.lab.test"
    settings.OIDC_PROVIDER_NAME = "Lab SSO"
    assert "Sign in with Lab SSO" in Client().get("/accounts/login/").content.decode()
