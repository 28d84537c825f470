"""GET /api/v1/usage/: ledger rows; admins all, managers their teams', members their own; filters; bad input."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def _rows(client, query: str = "") -> list[dict]:
    resp = client.get(f"/api/v1/usage/{query}")
    assert resp.status_code == 200, resp.content
    return resp.json()["results"]


@pytest.mark.parametrize(
    "who,users",
    [
        ("admin", {"alice", "bob", "charlie"}),
        ("alice", {"alice", "bob"}),  # the manager sees the team
        ("bob", {"bob"}),  # a member sees their own rows
        ("charlie", {"charlie"}),
    ],
)
def test_who_sees_which_rows(october, api_as, admin, alice, bob, charlie, who, users):
    user = {"admin": admin, "alice": alice, "bob": bob, "charlie": charlie}[who]
    assert {r["user"] for r in _rows(api_as(user))} == users


def test_anonymous_is_refused(october, api_as):
    resp = api_as(None).get("/api/v1/usage/")
    assert resp.status_code == 401 and resp.json()["code"] == "unauthenticated"


def test_row_shape_and_idle_cost(october, api_as, alice):
    [row] = _rows(api_as(alice), "?source=job")
    assert row["team"] == "vision" and row["user"] == "alice" and row["gpu_model"] == "L40S"
    assert row["source_id"] == october["job"].job_id
    assert (row["gpu_seconds"], row["cost"], row["mean_utilization"], row["idle_cost"]) == (
        10800,
        "3.30000000",
        "0.250000",
        "2.47500000",
    )
    assert row["start"].endswith("+00:00") or row["start"].endswith("Z")


def test_filters(october, api_as, admin):
    client = api_as(admin)
    assert {r["team"] for r in _rows(client, "?team=nlp")} == {"nlp"}
    assert {r["source"] for r in _rows(client, "?source=reservation")} == {"reservation"}
    assert {r["gpu_model"] for r in _rows(client, "?gpu_model=L40S")} == {"L40S"}
    assert len(_rows(client, "?month=2026-10")) == 4
    assert _rows(client, "?month=2026-09") == []
    job_id = october["charlie_job"].job_id
    assert [r["user"] for r in _rows(client, f"?source=job&source_id={job_id}")] == ["charlie"]


@pytest.mark.parametrize(
    "query,status,field",
    [
        ("?month=2026-13", 400, "month"),
        ("?month=oct", 400, "month"),
        ("?month=2099-01", 400, "month"),
        ("?source=lunch", 400, "source"),
        ("?source_id=x", 400, "source_id"),
        ("?team=nlp", 404, None),  # a team alice does not belong to
        ("?team=nope", 404, None),
    ],
)
def test_bad_input(october, api_as, alice, query, status, field):
    resp = api_as(alice).get(f"/api/v1/usage/{query}")
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert {"code", "detail", "fields"} <= set(body)
    if field:
        assert field in body["fields"]


def test_team_detail_carries_month_to_date_usage(october, api_as, bob):
    body = api_as(bob).get("/api/v1/teams/vision/").json()
    usage = body["usage"]
    assert usage["team"] == "vision" and usage["currency"] == "EUR"
    assert set(usage) >= {"month", "gpu_hours", "cost", "running_gpus", "projected_month_cost", "budget_used"}
