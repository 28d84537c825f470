"""In headless Chromium against the live server: a manager registers a webhook (the secret shown once), opens its
delivery log, and a member chooses mail notifications."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from apps.events import outbox
from apps.events.models import MailPreference, WebhookEndpoint
from apps.events.services import publish
from tests.browser.test_pages import signed_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]


def test_a_manager_registers_a_webhook_and_reads_its_delivery_log(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(live_portal.url + "/accounts/settings/")
        page.click("text=Webhooks")
        page.fill('input[name="url"]', "http://93.184.215.14/ci-hook")
        page.check('input[name="events"][value="job.*"]')
        page.click("button:has-text('Register')")
        secret = page.inner_text("#new-secret")
        assert secret.startswith("whsec_")
        endpoint = WebhookEndpoint.objects.get()
        assert endpoint.team == vision and endpoint.events == ["job.*"]

        publish("job.failed", team_id=vision.pk, subject="jobs/31", data={"id": 31})
        outbox.sweep()
        page.goto(live_portal.url + "/events/webhooks/")
        assert secret not in page.content()
        page.click("text=http://93.184.215.14/ci-hook")
        log = page.inner_text("table.table")
        assert "job.failed" in log and "jobs/31" in log and "Pending" in log
        assert page.locator("figure.delivery-chart svg").count() == 1


def test_a_member_chooses_mail_notifications(live_portal: Any, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with signed_in(live_portal, bob, monkeypatch) as page:
        page.goto(live_portal.url + "/accounts/settings/")
        page.click("text=Mail notifications")
        page.check('input[name="job_failed"]')
        page.click("button:has-text('Save')")
        page.wait_for_selector(".messages .msg-success")
        assert page.is_checked('input[name="job_failed"]') and not page.is_checked('input[name="job_finished"]')
    assert MailPreference.objects.get(user=bob).job_failed
