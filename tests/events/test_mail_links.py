"""A mail links to the page of what it is about, at PORTAL_URL; without PORTAL_URL it carries no link."""

from __future__ import annotations

import pytest

from apps.events.mail import page_url, render
from apps.events.models import OutboxEvent


@pytest.mark.parametrize(
    ("subject", "path"),
    [
        ("jobs/12", "/jobs/12/"),
        ("reservations/7", "/book/reservations/7/"),
        ("webhooks/3", "/events/webhooks/3/"),
        ("waitlist/5", "/book/"),
        ("teams/9/budget/2026-12", "/costs/"),
        ("nodes/gpu-01", "/fleet/"),
        ("something/else", None),
        ("jobs/12/../../admin", None),
    ],
)
def test_each_subject_links_to_its_page(settings, subject, path):
    settings.PORTAL_URL = "https://gpu.example.org/"
    assert page_url(subject) == (None if path is None else "https://gpu.example.org" + path)


def test_the_mail_body_carries_the_link_only_where_the_portal_knows_its_address(settings):
    event = OutboxEvent(event_type="reservation.released", subject="reservations/7", data={"reason": "idle"})
    settings.PORTAL_URL = "https://gpu.example.org"
    subject, body = render(event)
    assert subject == "[GPU Portal] reservation released: reservations/7"
    assert "Open: https://gpu.example.org/book/reservations/7/\n" in body and "reason: idle" in body
    settings.PORTAL_URL = ""
    assert "Open:" not in render(event)[1]
