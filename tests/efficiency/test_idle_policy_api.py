"""GET/PATCH /api/v1/teams/{slug}/idle-policy/: members read (defaults when the team has no row), admins write
(audited), bad input gets the error shape, outsiders get 404."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.efficiency.models import IdlePolicy

pytestmark = pytest.mark.django_db
URL = "/api/v1/teams/vision/idle-policy/"


def test_member_reads_the_defaults(api_as, bob):
    resp = api_as(bob).get(URL)
    assert resp.status_code == 200
    assert resp.json() == {
        "team": "vision",
        "enabled": True,
        "warn_after_min": 60,
        "reclaim_after_min": 15,
        "utilization_below_pct": 5,
        "memory_below_pct": 10,
        "applies_to": ["reservations", "jobs"],
        "unused_release_after_min": 30,
    }


def test_outsider_gets_404_and_manager_may_not_write(api_as, charlie, alice):
    assert api_as(charlie).get(URL).status_code == 404
    assert api_as(alice).patch(URL, {"warn_after_min": 5}, format="json").status_code == 403


def test_admin_changes_it_and_it_is_audited(api_as, admin, vision):
    resp = api_as(admin).patch(URL, {"warn_after_min": 15, "applies_to": ["jobs"]}, format="json")
    assert resp.status_code == 200 and resp.json()["warn_after_min"] == 15 and resp.json()["applies_to"] == ["jobs"]
    policy = IdlePolicy.objects.get(team=vision)
    assert policy.warn_after_min == 15 and policy.reclaim_after_min == 15
    assert AuditEvent.objects.get(action="idle_policy.update").data == {"warn_after_min": 15, "applies_to": ["jobs"]}


@pytest.mark.parametrize(
    "body",
    [{"warn_after_min": 0}, {"utilization_below_pct": 101}, {"applies_to": ["gpus"]}, {"nope": 1}, {"enabled": "y"}],
)
def test_bad_input_gets_the_error_shape(api_as, admin, vision, body):
    resp = api_as(admin).patch(URL, body, format="json")
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid" and resp.json()["fields"]


def test_admin_pages_list_policies_exemptions_marks_and_the_waitlist(admin, vision):
    from django.test import Client

    IdlePolicy.objects.create(team=vision, warn_after_min=20)
    client = Client()
    client.force_login(admin)
    for model in ("idlepolicy", "idleexemption", "idlemark", "waitlistentry"):
        assert client.get(f"/admin/efficiency/{model}/").status_code == 200, model
    assert client.get(f"/admin/efficiency/idlepolicy/{IdlePolicy.objects.get().pk}/change/").status_code == 200
