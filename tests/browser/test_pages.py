"""Everyday pages in headless Chromium against the live server (uvicorn on the test database): an admin drains
and undrains a node from the Fleet page, the Book form offers each team only the models its quota allows, the
home page draws the team's spend, a PDF statement downloads under its own name, and the favicon loads."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Quota
from apps.fleet.models import Node
from apps.jobs.models import JobState
from tests.billing import helpers
from tests.factories import GpuFactory, MembershipFactory, NodeFactory
from tests.pages import builders

# The marks of a test that drives Chromium (other modules' browser tests use them too).
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]
pytestmark = BROWSER_MARKS

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def open_listening(page: Any, url: str) -> None:
    """Open `url` and wait until its team socket has joined the team's group (its first message, `team.usage`):
    from then on the page hears what is pushed to the team."""
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))
    page.goto(url)
    for _ in range(100):
        if any("team.usage" in f for f in frames):
            return
        page.wait_for_timeout(100)


@contextmanager
def signed_in(live: Any, user: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Chromium page signed in as `user` that accepts confirm() dialogs and fails the test on a script error or
    a failed request (a missing favicon or bundle included)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between browser steps (Playwright's loop)
    from playwright.sync_api import sync_playwright

    client = Client()
    client.force_login(user)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
            context.add_cookies([{**cookie, "url": live.url}])
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}"))
            page.on("dialog", lambda d: d.accept())
            yield page
            assert not errors, errors
        finally:
            browser.close()
            # Closed while Playwright's loop still runs: the connection the test's ORM calls opened under it is
            # not the one the test database's teardown sees, and left open it blocks DROP DATABASE.
            connections.close_all()


def test_admin_drains_and_undrains_a_node_on_the_fleet_page(
    live_portal: Any, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    NodeFactory(name="rack1-gpu")
    with signed_in(live_portal, admin, monkeypatch) as page:
        page.goto(live_portal.url + "/fleet/")
        row = page.locator('#fleet-nodes tr[data-node="rack1-gpu"]')
        row.locator('button[data-action="drain"]').click()
        page.wait_for_selector(".messages .msg-success")
        assert "Node “rack1-gpu” is draining" in page.inner_text(".messages")
        assert "draining" in row.inner_text()
        assert Node.objects.get(name="rack1-gpu").draining

        row.locator('button[data-action="undrain"]').click()
        page.wait_for_selector(".messages .msg-success >> text=takes work again")
        assert row.locator('button[data-action="drain"]').count() == 1
        assert not Node.objects.get(name="rack1-gpu").draining
        audited = AuditEvent.objects.filter(actor=admin, action__in=["node.drain", "node.undrain"]).order_by("id")
        assert list(audited.values_list("action", flat=True)) == ["node.drain", "node.undrain"]


def test_book_form_offers_each_team_the_models_its_quota_allows(
    live_portal: Any, alice: Any, nlp: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h100 = helpers.gpu_model("H100-80GB", "4.0000")
    helpers.gpus(1, model=h100, node="b-h100")
    helpers.gpus(1, model=helpers.gpu_model("L40S", "1.0000"), node="b-l40s")
    quota = Quota.objects.create(team=vision)
    quota.allowed_models.set([h100])
    MembershipFactory(user=alice, team=nlp)
    options = "s => Array.from(document.querySelectorAll(s + ' option')).map(o => o.value)"
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(live_portal.url + "/book/")
        page.wait_for_selector(".tl-row")
        page.select_option("#book-team", "vision")
        assert page.evaluate(options, "#book-model") == ["H100-80GB"]
        page.select_option("#book-team", "nlp")
        assert page.evaluate(options, "#book-model") == ["H100-80GB", "L40S"]
        page.select_option("#book-model", "L40S")
        page.select_option("#book-team", "vision")  # L40S is not allowed there: the select falls back
        assert page.evaluate("document.getElementById('book-model').value") == "H100-80GB"


def test_home_page_draws_my_teams_spend_and_lists_my_work(
    live_portal: Any, bob: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    [gpu] = helpers.gpus(1, model=helpers.gpu_model("A100-80GB", "3.0000"))
    now = timezone.now()
    month_start = timezone.localtime(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    helpers.run_job(vision, bob, gpu, max(now - timedelta(hours=2), month_start), now)
    job = builders.job(vision, bob, state=JobState.RUNNING, name="on the home page")
    reservation = builders.reservation(vision, bob, start=now + timedelta(hours=3))
    with signed_in(live_portal, bob, monkeypatch) as page:
        page.goto(live_portal.url + "/")
        page.wait_for_function("() => document.getElementById('home-spend-chart').dataset.rendered === '1'")
        assert f"Job {job.pk} · on the home page" in page.inner_text("#home-jobs")
        assert f"#{reservation.pk} " in page.inner_text("#home-reservations")
        assert "EUR" in page.inner_text("#home-spend")
        # The favicon is the local one and it loads (a failed request would fail the test).
        icon = page.evaluate("document.querySelector('link[rel=icon]').href")
        assert icon == live_portal.url + "/static/core/favicon.svg"
        assert page.request.get(icon).status == 200
        # Live figures are formatted as the server formats them.
        assert page.evaluate("window.Portal.amount('0.00559999999999999')") == "0.01"
        assert page.evaluate("window.Portal.amount('2000.0000')") == "2,000.00"


def test_reservation_and_job_pages_read_their_own_gpus_live_in_a_large_fleet(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More GPUs than one page of the GPU list holds (1,000), and the ones held sort last: each page asks for its
    own GPUs by uuid and shows what they report now."""
    from apps.booking import services as booking
    from apps.fleet.models import Gpu, GpuModel
    from apps.telemetry.ingest import telemetry_ingest
    from tests.fleet.util import registered_node, row, telemetry

    node, token = registered_node("zz-last")
    filler = NodeFactory(name="aaa-first")
    model = GpuModel.objects.get(name="A100-80GB")
    Gpu.objects.bulk_create(
        [
            Gpu(node=filler, index=i, model=model, uuid=f"GPU-filler-{i:04d}", memory_mib=model.memory_mib)
            for i in range(1000)
        ],
        batch_size=500,
    )
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    held = booking.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=2), gpus=["GPU-zz-last-0"]
    ).reservation
    booking.reservations_tick(now=timezone.now())
    job = builders.job(vision, alice, state=JobState.RUNNING, node=node, started_at=timezone.now())
    job.gpus.set([Gpu.objects.get(uuid="GPU-zz-last-1")])
    rows = [row("GPU-zz-last-0", util=77, mem=2048), row("GPU-zz-last-1", util=33, mem=4096)]
    telemetry_ingest(telemetry("zz-last", token, rows))
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/book/reservations/{held.pk}/")
        page.wait_for_function(
            "() => document.querySelector('#res-devices tr[data-gpu=\"GPU-zz-last-0\"] .util')?.textContent === '77%'"
        )
        assert page.inner_text('#res-devices tr[data-gpu="GPU-zz-last-0"] .mem') == "2.0 GiB"
        page.goto(f"{live_portal.url}/jobs/{job.pk}/")
        page.wait_for_function(
            "() => document.querySelector('#job-gpus tr[data-uuid=\"GPU-zz-last-1\"] .util')?.textContent === '33%'"
        )
        assert page.inner_text('#job-gpus tr[data-uuid="GPU-zz-last-1"] .mem') == "4.0 GiB"


def test_pdf_statement_downloads_under_its_own_name(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    Quota.objects.create(team=vision, budget_soft=Decimal("100"))
    month = timezone.localtime(timezone.now()).strftime("%Y-%m")
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(live_portal.url + "/costs/teams/vision/")
        with page.expect_download() as info:
            page.click("text=statement (PDF)")
        download = info.value
        assert download.suggested_filename == f"gpu-statement-vision-{month}.pdf"
        with open(download.path(), "rb") as pdf:
            assert pdf.read(5) == b"%PDF-"


def test_job_form_lets_one_pick_only_the_chosen_teams_reservations(
    live_portal: Any, alice: Any, nlp: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    MembershipFactory(user=alice, team=nlp)
    mine = builders.reservation(vision, alice)
    theirs = builders.reservation(nlp, alice)
    disabled = (
        "Array.from(document.querySelectorAll('#id_reservation optgroup')).filter(g => g.disabled).map(g => g.label)"
    )
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/new/?team=vision&reservation={mine.pk}")
        assert page.evaluate(disabled) == ["nlp"]
        assert page.input_value("#id_reservation") == str(mine.pk)
        page.select_option("#id_team", "nlp")
        assert page.evaluate(disabled) == ["vision"]
        assert page.input_value("#id_reservation") == ""  # vision's reservation is not nlp's to run in
        page.select_option("#id_reservation", str(theirs.pk))
        assert page.input_value("#id_reservation") == str(theirs.pk)


def test_token_scopes_sit_beside_their_checkboxes_and_a_token_is_made(
    live_portal: Any, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(live_portal.url + "/accounts/settings/")
        for label in page.locator("fieldset label").all():
            box = label.locator("input[type=checkbox]").bounding_box()
            whole = label.bounding_box()
            assert box and whole
            # On one line: the label is about one line tall and its text starts to the right of the box.
            assert whole["height"] < 2.2 * box["height"] + 8, (label.inner_text(), whole, box)
            assert box["x"] - whole["x"] < 10, (label.inner_text(), whole, box)
        assert page.locator("fieldset input[value=admin]").count() == 0  # alice is not staff
        page.fill("#id_name", "ci")
        page.check("fieldset input[value=read]")
        page.click("text=Create token")
        assert page.locator(".token-once code").inner_text().startswith("gpp_")


def test_the_api_docs_render_under_the_content_security_policy(
    live_portal: Any, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swagger UI starts from a script file of its own (an inline one would be refused: a console error fails this)."""
    with signed_in(live_portal, alice, monkeypatch) as page:
        response = page.goto(live_portal.url + "/api/docs/")
        assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
        assert "GPU Portal API" in page.inner_text(".swagger-ui .info .title")
        page.wait_for_selector(".opblock-tag", timeout=20_000)


def test_django_admin_pages_render_under_the_content_security_policy(
    live_portal: Any, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin is not the portal's own markup: its inline styles are allowed under /admin/, its scripts are files.
    A refused style or script is a console error, which fails this."""
    NodeFactory(name="rack1-gpu")
    with signed_in(live_portal, admin, monkeypatch) as page:
        for path in ("/admin/", "/admin/fleet/node/", "/admin/fleet/node/add/", "/admin/booking/reservation/"):
            response = page.goto(live_portal.url + path)
            assert response is not None and response.status == 200, path
            assert "style-src 'self' 'unsafe-inline'" in response.headers["content-security-policy"]
        page.goto(live_portal.url + "/admin/fleet/node/")
        page.check("#action-toggle")  # the change list's select-all: admin's actions.js runs
        assert page.locator("input.action-select:checked").count() == 1


def test_the_jobs_list_follows_its_teams_jobs_without_a_reload(
    live_portal: Any, alice: Any, bob: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teammate submits a job while the Jobs list is open: its row appears; it starts and ends: the row says so.
    The page is the same document throughout (no reload)."""
    from apps.jobs import services as jobs
    from apps.jobs.models import ContainerImage, JobReason

    ContainerImage.objects.create(name="local/process", description="process runtime")
    GpuFactory(node=NodeFactory(name="node01"), index=0)
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/")
        page.wait_for_selector('#jobs-table[data-live="1"]')
        page.evaluate("() => { window.__sameDocument = true; }")
        job = jobs.job_submit(user=bob, team=vision, image="local/process", command=["true"], max_duration_s=600)
        row = f'#jobs-table tr[data-job="{job.pk}"]'
        page.wait_for_selector(f"{row} .badge.state-queued")
        job = jobs.job_transition(job, JobState.CANCELLED, reason=JobReason.CANCELLED, message="by bob")
        page.wait_for_selector(f"{row} .badge.state-cancelled")
        assert page.evaluate("() => window.__sameDocument") is True


def test_the_home_page_follows_my_jobs_and_bookings_without_a_reload(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.booking import services as booking
    from apps.jobs import services as jobs
    from apps.jobs.models import ContainerImage
    from tests.booking.conftest import slot

    ContainerImage.objects.create(name="local/process", description="process runtime")
    GpuFactory(node=NodeFactory(name="node01"), index=0, uuid="GPU-home-0")
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/")
        page.wait_for_selector('body[data-livejobs="1"][data-livebookings="1"]')
        page.evaluate("() => { window.__sameDocument = true; }")
        job = jobs.job_submit(user=alice, team=vision, image="local/process", command=["true"], max_duration_s=600)
        page.wait_for_selector(f'#home-jobs a[href="/jobs/{job.pk}/"]')
        start, end = slot(days=1, hour=10)
        r = booking.reservation_create(user=alice, team=vision, start=start, end=end, gpus=["GPU-home-0"]).reservation
        page.wait_for_function(f"() => document.querySelector('#home-reservations').textContent.includes('#{r.pk}')")
        assert page.evaluate("() => window.__sameDocument") is True


def test_a_long_command_wraps_inside_the_job_page(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command with a long unbroken argument (a path, a digest) wraps in the details column: the page does not
    grow sideways past the window."""
    long_path = "/datasets/" + "imagenet_shard_" * 12 + "0001.tar"
    job = builders.job(vision, alice, command=["python3", "-c", "import os; print(os.environ.get('X'))", long_path])
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/{job.pk}/")
        assert long_path in page.locator(".kv code", has_text="python3").inner_text()
        assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def test_the_everyday_pages_fit_a_phone_screen(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 390 px wide nothing widens a page past the screen (wide tables scroll inside their box): not a select's
    long option on the job form, not a reservation's devices, not the charts of the costs and GPU pages."""
    from apps.booking import services as booking
    from apps.jobs.models import ContainerImage

    ContainerImage.objects.create(name="local/process", description="process runtime")
    gpu = GpuFactory(node=NodeFactory(name="node01"), index=0, uuid="GPU-phone-0")
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(hours=1)
    held = booking.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=2), gpus=[gpu.uuid], note="x" * 120
    ).reservation
    job = builders.job(vision, alice, command=["python3", "-c", "import os; print(os.environ.get('CUDA_VISIBLE'))"])
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.set_viewport_size({"width": 390, "height": 900})
        for path in (
            "/",
            "/jobs/new/",
            f"/jobs/{job.pk}/",
            f"/book/reservations/{held.pk}/",
            "/costs/",
            f"/costs/teams/{vision.slug}/",
            f"/fleet/gpus/{gpu.uuid}/",
        ):
            page.goto(f"{live_portal.url}{path}")
            page.wait_for_load_state("networkidle")
            width = page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= 390, (path, width)
