"""LDAP sign-in in headless Chromium: the portal (uvicorn, its own process) against slapd started by the test. A new
user signs in through the form, lands in the team their directory group maps to, and loses it at the next sign-in
once the directory drops them from the group."""

from __future__ import annotations

from typing import Any

from apps.accounts.models import Membership
from apps.identity.models import GroupMapping
from tests.conftest import free_port
from tests.factories import TeamFactory
from tests.identity.support import slapd, start_portal
from tests.identity.test_oidc_browser import browser_page, needs_chromium


def _sign_in_with_form(page: Any, portal_url: str, username: str, password: str) -> None:
    page.goto(portal_url + "/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("form button[type=submit]")
    page.wait_for_load_state()


@needs_chromium
def test_a_directory_user_signs_in_in_a_browser_and_follows_their_group(transactional_db: Any) -> None:
    vision = TeamFactory(slug="vision", name="Vision")
    GroupMapping.objects.create(group="gpu-vision", team=vision, role="member")
    with slapd() as directory:
        dn = directory.add_person("frank", "frank-directory-pw", mail="frank@lab.test", given="Frank")
        directory.add_group("gpu-vision", [dn])
        portal = start_portal(free_port(), **directory.portal_env())
        try:
            with browser_page() as page:
                _sign_in_with_form(page, portal.url, "frank", "not-franks-password")
                assert "correct username and password" in page.content()
                _sign_in_with_form(page, portal.url, "frank", "frank-directory-pw")
                assert page.url == portal.url + "/"
                me = page.request.get(portal.url + "/api/v1/me").json()
                assert me["username"] == "frank"
                assert [(t["team"]["slug"], t["role"]) for t in me["teams"]] == [("vision", "member")]

            directory.set_members("gpu-vision", [])
            with browser_page() as page:
                _sign_in_with_form(page, portal.url, "frank", "frank-directory-pw")
                assert page.request.get(portal.url + "/api/v1/me").json()["teams"] == []
        finally:
            portal.stop()
    assert not Membership.objects.filter(user__username="frank").exists()
