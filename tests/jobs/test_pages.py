"""Job pages: list with filters, the submit form with inline errors, the job page, cancel; and the job page in
headless Chromium (a real uvicorn) showing log lines live as they are stored."""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.jobs import services
from apps.jobs.models import Job, JobState
from tests.jobs.conftest import BUSYBOX

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_pages_need_a_signed_in_user(fleet: Any) -> None:
    for path in ("/jobs/", "/jobs/new/", "/jobs/1/"):
        response = Client().get(path)
        assert response.status_code == 302 and "/accounts/login" in response["Location"]


@pytest.mark.django_db
def test_list_shows_only_visible_jobs_and_filters(alice, charlie, vision, nlp, submit) -> None:
    mine = submit(alice, vision, name="alice-train")
    theirs = submit(charlie, nlp, name="charlie-eval")
    done = submit(alice, vision, name="alice-cancelled")
    services.job_cancel(job=done, user=alice)
    page = _client(alice).get("/jobs/").content.decode()
    assert "alice-train" in page and "alice-cancelled" in page and "charlie-eval" not in page
    page = _client(alice).get("/jobs/?state=queued").content.decode()
    assert "alice-train" in page and "alice-cancelled" not in page
    assert f'data-job="{theirs.pk}"' not in _client(alice).get("/jobs/").content.decode()
    assert f'data-job="{mine.pk}"' in _client(alice).get("/jobs/?team=vision&mine=1").content.decode()


@pytest.mark.django_db
def test_submit_form_shows_errors_inline_and_queues_nothing(alice, vision, fleet, images) -> None:
    client = _client(alice)
    assert client.get("/jobs/new/").status_code == 200
    form = {
        "team": "vision", "name": "x", "image": BUSYBOX, "command": "echo\nhi", "env": "",
        "gpu_count": "12", "gpu_model": "", "cpus": "1", "memory_mib": "1024", "max_duration_s": "60", "priority": "0",
    }  # fmt: skip
    response = client.post("/jobs/new/", form)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="error-gpu_count"' in html and "No node has 12" in html
    response = client.post("/jobs/new/", {**form, "gpu_count": "1", "env": "1BAD=x"})
    assert 'id="error-env"' in response.content.decode()
    assert Job.objects.count() == 0

    response = client.post("/jobs/new/", {**form, "gpu_count": "1", "env": "A=1\nB=two=2"})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.command == ["echo", "hi"] and job.env == {"A": "1", "B": "two=2"}


@pytest.mark.django_db
def test_job_page_shows_the_timeline_and_is_404_for_outsiders(alice, charlie, vision, submit) -> None:
    job = submit(alice, vision, name="visible")
    html = _client(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "visible" in html and 'id="job-timeline"' in html and "queued" in html and 'id="cancel-button"' in html
    assert _client(charlie).get(f"/jobs/{job.pk}/").status_code == 404


@pytest.mark.django_db
def test_cancel_from_the_page(alice, bob, vision, submit) -> None:
    job = submit(alice, vision)
    _client(bob).post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED  # a teammate may not
    _client(alice).post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
@pytest.mark.django_db(transaction=True)
def test_job_page_shows_logs_live_in_chromium(alice, vision, fleet, submit, live_portal) -> None:
    from playwright.sync_api import sync_playwright

    job = submit(alice, vision, name="live-logs")
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    now = timezone.now()
    early = [services.LogLineIn("stdout", "line before the page opened", now)]
    services.job_logs_append(node_id=fleet["node01"].pk, job_id=job.pk, epoch="e", first=1, lines=early)

    client = _client(alice)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.add_cookies([{**cookie, "url": live_portal.url}])
            page = context.new_page()
            page.goto(f"{live_portal.url}/jobs/{job.pk}/")
            page.wait_for_function("() => document.getElementById('log-status').textContent === 'live'", timeout=15000)
            assert page.inner_text("#job-cost-label") == "Cost so far"
            page.wait_for_function(
                "() => document.getElementById('job-logs').textContent.includes('line before the page opened')",
                timeout=10000,
            )

            def produce() -> None:
                try:
                    fresh = Job.objects.get(pk=job.pk)
                    services.job_transition(fresh, JobState.RUNNING)
                    for i in (2, 3, 5, 6, 4):  # line 4 comes last, as a delayed batch would: it goes into its place
                        stream = "stderr" if i == 4 else "stdout"
                        line = services.LogLineIn(stream, f"live line {i}", timezone.now())
                        services.job_logs_append(
                            node_id=fleet["node01"].pk, job_id=job.pk, epoch="e", first=i, lines=[line]
                        )
                        time.sleep(0.1)
                finally:
                    connection.close()

            worker = threading.Thread(target=produce)
            worker.start()
            page.wait_for_function(
                "() => document.getElementById('job-logs').textContent.includes('live line 4')", timeout=15000
            )
            worker.join()
            text = page.inner_text("#job-logs")
            assert [line for line in text.splitlines() if line.startswith("live line")] == [
                f"live line {i}" for i in range(2, 7)
            ]
            assert page.locator("#job-logs .stderr").first.inner_text().strip() == "live line 4"
            page.wait_for_function(
                "() => document.getElementById('job-state').textContent === 'running'", timeout=10000
            )

            def finish() -> None:
                try:
                    fresh = Job.objects.get(pk=job.pk)
                    services.job_transition(fresh, JobState.SUCCEEDED, reason="exit_code", exit_code=0)
                    last = [services.LogLineIn("stdout", "written as it exited", timezone.now())]
                    services.job_logs_append(node_id=fleet["node01"].pk, job_id=job.pk, epoch="e", first=7, lines=last)
                finally:
                    connection.close()

            # Once the job has ended the page no longer calls its logs "live", yet the last lines still arrive.
            ender = threading.Thread(target=finish)
            ender.start()
            ender.join()
            page.wait_for_function(
                "() => document.getElementById('job-state').textContent === 'succeeded'", timeout=10000
            )
            page.wait_for_function("() => document.getElementById('log-status').textContent === 'ended'", timeout=10000)
            assert page.inner_text("#job-cost-label") == "Cost"  # no longer "so far"
            page.wait_for_function(
                "() => document.getElementById('job-logs').textContent.includes('written as it exited')", timeout=10000
            )
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_job_page_opened_at_a_gap_shows_the_held_lines_once_it_fills(alice, vision, fleet, submit, live_portal) -> None:
    """Lines after a missing one are held back by the logs endpoint (`waiting`): the page asks again, so once the
    late line lands it shows the rest too, though those were stored (and pushed) before the page opened."""
    from playwright.sync_api import sync_playwright

    job = submit(alice, vision, name="gap")
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    node = fleet["node01"].pk

    def append(first: int, text: str) -> None:
        line = services.LogLineIn("stdout", text, timezone.now())
        services.job_logs_append(node_id=node, job_id=job.pk, epoch="e", first=first, lines=[line])

    append(1, "gap line 1")
    append(3, "gap line 3")  # line 2 is late
    client = _client(alice)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.add_cookies([{**cookie, "url": live_portal.url}])
            page = context.new_page()
            page.goto(f"{live_portal.url}/jobs/{job.pk}/")
            page.wait_for_function("() => document.getElementById('log-status').textContent === 'live'", timeout=15000)
            page.wait_for_function(
                "() => document.getElementById('job-logs').textContent.includes('gap line 1')", timeout=10000
            )
            assert "gap line 3" not in page.inner_text("#job-logs")  # held back while line 2 may come
            # The ORM is not for the thread that runs Playwright's event loop.
            late = threading.Thread(target=lambda: (append(2, "gap line 2"), connection.close()))
            late.start()
            late.join()
            page.wait_for_function(
                "() => document.getElementById('job-logs').textContent.includes('gap line 3')", timeout=15000
            )
            text = page.inner_text("#job-logs")
            assert [line for line in text.splitlines() if line.startswith("gap line")] == [
                f"gap line {i}" for i in (1, 2, 3)
            ]
        finally:
            browser.close()


@pytest.mark.django_db
def test_the_cli_is_served_as_one_file_without_login() -> None:
    response = Client().get("/jobs/cli/gpuportal.py")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/x-python")
    assert b"def main(" in response.content and b"import requests" in response.content
