"""The Content-Security-Policy: on every response, and kept possible by the templates (no inline script or event
handler anywhere: they would not run). The pages under it in a browser are the browser tests' business: each fails
on a console error, and a refused script is one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path", ["/accounts/login/", "/", "/api/v1/health", "/api/v1/nope/", "/no-such-page/", "/jobs/?q=%00"]
)
def test_every_response_carries_the_policy(path: str, client: Client, alice) -> None:
    client.force_login(alice)
    response = client.get(path)
    assert response["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in response["Content-Security-Policy"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"].split("script-src")[1].split(";")[0]


def test_the_docs_page_starts_swagger_from_a_file(client: Client, alice) -> None:
    client.force_login(alice)
    html = client.get("/api/docs/").content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>\s*\S", html), "an inline script on the docs page"


def test_it_can_be_turned_off(client: Client, settings) -> None:
    from apps.core.middleware import ContentSecurityPolicyMiddleware

    settings.CONTENT_SECURITY_POLICY = ""
    middleware = ContentSecurityPolicyMiddleware(lambda request: client.get("/accounts/login/"))
    assert "Content-Security-Policy" not in middleware(None)  # type: ignore[arg-type]


def test_no_template_has_an_inline_script_or_handler() -> None:
    templates = [p for base in (ROOT / "apps", ROOT / "portal", ROOT / "templates") for p in base.rglob("*.html")]
    assert len(templates) > 20
    handler = re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE)
    inline = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.IGNORECASE)
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)[:80]}"
        for p in templates
        for m in [*handler.finditer(p.read_text()), *inline.finditer(p.read_text())]
    ]
    assert not found, found


@pytest.mark.parametrize("path", ["/", "/accounts/login/", "/fleet/", "/book/", "/api/v1/health"])
def test_the_portals_own_pages_allow_no_inline_style(path: str, client: Client, alice) -> None:
    client.force_login(alice)
    style_src = client.get(path)["Content-Security-Policy"].split("style-src")[1].split(";")[0]
    assert style_src.split() == ["'self'"]


@pytest.mark.parametrize("path", ["/admin/", "/admin/login/", "/api/docs/"])
def test_admin_and_swagger_may_use_inline_styles_but_not_scripts(path: str, client: Client, admin_user) -> None:
    client.force_login(admin_user)
    policy = client.get(path)["Content-Security-Policy"]
    assert "style-src 'self' 'unsafe-inline'" in policy
    assert "script-src 'self';" in policy and policy.count("unsafe-inline") == 1


def test_inline_styles_are_added_to_style_src_or_made_from_default_src() -> None:
    from apps.core.middleware import with_inline_styles

    assert with_inline_styles("default-src 'self'; style-src 'self' https://cdn.example") == (
        "default-src 'self'; style-src 'self' https://cdn.example 'unsafe-inline'"
    )
    assert with_inline_styles("default-src 'self' https://x.example") == (
        "default-src 'self' https://x.example; style-src 'self' https://x.example 'unsafe-inline'"
    )
    assert with_inline_styles("style-src 'unsafe-inline'") == "style-src 'unsafe-inline'"


def test_no_template_has_a_style_block_or_attribute() -> None:
    templates = [p for base in (ROOT / "apps", ROOT / "portal", ROOT / "templates") for p in base.rglob("*.html")]
    pattern = re.compile(r"<style\b|\sstyle\s*=", re.IGNORECASE)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in templates for m in pattern.finditer(p.read_text())]
    assert not found, found
