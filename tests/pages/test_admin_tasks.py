"""An admin's everyday tasks in the pages: drain and undrain from the Fleet page, booking forms that offer what a
quota allows, messages that name things, PDF statements that download, the favicon."""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any

from django.test import Client
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Quota, Reservation
from apps.fleet.models import Node, NodeStatus
from tests.billing import helpers
from tests.factories import MembershipFactory, NodeFactory


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- Drain and undrain from the Fleet page ----------------------------------------------------------------------


def test_admin_drains_and_undrains_a_node_from_the_fleet_page(admin: Any) -> None:
    NodeFactory(name="gpu-a")
    client = _client(admin)
    page = client.get("/fleet/").content.decode()
    assert 'id="fleet-admin"' in page and 'action="/fleet/nodes/gpu-a/drain/"' in page

    response = client.post("/fleet/nodes/gpu-a/drain/", follow=True)
    html = response.content.decode()
    assert response.redirect_chain[-1][0] == "/fleet/"
    assert "Node “gpu-a” is draining" in html and 'action="/fleet/nodes/gpu-a/undrain/"' in html
    node = Node.objects.get(name="gpu-a")
    assert node.draining and node.status == NodeStatus.DRAINING
    event = AuditEvent.objects.get(action="node.drain")
    assert event.actor == admin and event.target_repr == "gpu-a"

    html = client.post("/fleet/nodes/gpu-a/undrain/", follow=True).content.decode()
    assert "Node “gpu-a” takes work again." in html
    node.refresh_from_db()
    assert not node.draining and node.status == NodeStatus.ONLINE
    assert AuditEvent.objects.filter(action="node.undrain", actor=admin).count() == 1


def test_only_admins_drain_and_only_by_post(admin: Any, bob: Any) -> None:
    NodeFactory(name="gpu-b")
    member = _client(bob)
    assert 'id="fleet-admin"' not in member.get("/fleet/").content.decode()
    assert member.post("/fleet/nodes/gpu-b/drain/").status_code == 403
    assert Client().post("/fleet/nodes/gpu-b/drain/").status_code == 302  # to sign in
    assert _client(admin).get("/fleet/nodes/gpu-b/drain/").status_code == 405
    assert _client(admin).post("/fleet/nodes/nope/drain/").status_code == 404
    assert not Node.objects.get(name="gpu-b").draining
    assert not AuditEvent.objects.filter(action="node.drain").exists()


# --- The booking form offers what the team's quota allows ---------------------------------------------------------


def test_booking_form_offers_each_team_only_the_models_its_quota_allows(alice: Any, charlie: Any, vision: Any) -> None:
    h100 = helpers.gpu_model("H100-80GB", "4.0000")
    helpers.gpus(1, model=h100, node="n-h100")
    helpers.gpus(1, model=helpers.gpu_model("L40S", "1.0000"), node="n-l40s")
    quota = Quota.objects.create(team=vision)
    quota.allowed_models.set([h100])
    nlp_member = charlie
    MembershipFactory(user=nlp_member, team=vision)  # charlie is in both teams: nlp has no quota
    html = _client(nlp_member).get("/book/").content.decode()
    config = json.loads(html.split('id="book-config" type="application/json">')[1].split("</script>")[0])
    offered = {t["slug"]: t["models"] for t in config["teams"]}
    assert offered == {"nlp": ["H100-80GB", "L40S"], "vision": ["H100-80GB"]}
    first_team = config["teams"][0]["slug"]
    select = html[html.index('id="book-model"') : html.index("</select>", html.index('id="book-model"'))]
    assert select.count("<option") == len(offered[first_team])
    assert _client(alice).get("/book/").status_code == 200


# --- Names in messages --------------------------------------------------------------------------------------------


def test_admin_success_message_names_the_quota(admin: Any, vision: Any) -> None:
    response = _client(admin).post(
        "/admin/booking/quota/add/",
        {"team": vision.pk, "month": "2026-12-01", "gpu_hours": "100", "max_concurrent_gpus": "4"},
        follow=True,
    )
    html = re.sub(r"<a [^>]*>|</a>", "", response.content.decode())  # the name links to the quota
    assert "The quota “vision, 2026-12” was added successfully." in html
    assert str(Quota(team=vision)) == "vision, every month"


def test_models_name_their_team_and_things(vision: Any, bob: Any) -> None:
    quota = Quota.objects.create(team=vision, month=date(2026, 12, 1))
    assert str(quota) == "vision, 2026-12"
    [gpu] = helpers.gpus(1, model=helpers.gpu_model("A100-80GB", "2.5000"), node="n1")
    [allocation] = helpers.reserve(vision, bob, [gpu], _at("2026-12-05T10:00"), _at("2026-12-05T18:00"))
    reservation = Reservation.objects.get()
    assert str(reservation) == f"#{reservation.pk} vision: 1 x A100-80GB, 2026-12-05 10:00 to 18:00"
    assert str(allocation) == f"n1/0 (A100-80GB) for vision (reservation #{reservation.pk}), 2026-12-05 10:00 to 18:00"


def _at(text: str) -> datetime:
    return timezone.make_aware(datetime.fromisoformat(text))


# --- PDF statements download --------------------------------------------------------------------------------------


def test_pdf_statements_download_with_their_name(october: Any, admin: Any, alice: Any) -> None:
    client = _client(admin)
    response = client.get("/costs/report/2026-10.pdf")
    assert response["Content-Disposition"] == 'attachment; filename="gpu-report-2026-10.pdf"'
    response = client.get("/costs/report/2026-10/vision.pdf")
    assert response["Content-Disposition"] == 'attachment; filename="gpu-statement-vision-2026-10.pdf"'
    html = client.get("/costs/?month=2026-10").content.decode()
    assert 'href="/costs/report/2026-10.pdf" download>' in html
    assert 'href="/costs/report/2026-10/vision.pdf" download>' in html
    team_page = _client(alice).get("/costs/teams/vision/").content.decode()
    assert '.pdf" download>statement (PDF)</a>' in team_page


# --- Favicon ------------------------------------------------------------------------------------------------------


def test_pages_link_a_local_favicon_and_favicon_ico_points_at_it(bob: Any) -> None:
    html = _client(bob).get("/").content.decode()
    assert '<link rel="icon" href="/static/core/favicon.svg" type="image/svg+xml">' in html
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/core/favicon.svg"
    icon = Client().get("/static/core/favicon.svg")
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)  # WhiteNoise streams the file


def test_admin_success_message_names_the_idle_policys_team(admin: Any, vision: Any) -> None:
    response = _client(admin).post(
        "/admin/efficiency/idlepolicy/add/",
        {
            "team": vision.pk, "enabled": "on", "warn_after_min": 60, "reclaim_after_min": 15,
            "utilization_below_pct": 5, "memory_below_pct": 10, "applies_to": '["reservations", "jobs"]',
            "unused_release_after_min": 30,
        },
        follow=True,
    )  # fmt: skip
    html = re.sub(r"<a [^>]*>|</a>", "", response.content.decode())
    assert "The idle policy “idle policy of vision” was added successfully." in html
