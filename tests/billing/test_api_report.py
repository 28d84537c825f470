"""GET /api/v1/reports/monthly/: figures, scoping (managers their teams, admins all, members refused), CSV equals
JSON, bad input."""

from __future__ import annotations

import csv
import io

import pytest

pytestmark = pytest.mark.django_db
URL = "/api/v1/reports/monthly/"


def test_the_figures(october, api_as, admin):
    resp = api_as(admin).get(f"{URL}?month=2026-10")
    assert resp.status_code == 200, resp.content
    report = resp.json()
    assert (report["month"], report["currency"], report["status"], report["scope"]) == (
        "2026-10",
        "EUR",
        "open",
        "fleet",
    )
    nlp, vision = report["teams"]
    assert vision["team"] == "vision"
    assert (vision["gpu_hours"], vision["cost"], vision["idle_cost"]) == ("23.000", "53.30", "14.98")
    assert (vision["mean_utilization"], vision["unknown_utilization_gpu_hours"]) == ("0.4423", "10.000")
    assert vision["idle_cost_complete"] is False
    assert {m["gpu_model"]: m["cost"] for m in vision["by_gpu_model"]} == {"A100-80GB": "50.00", "L40S": "3.30"}
    assert {u["user"]: u["gpu_hours"] for u in vision["by_user"]} == {"alice": "3.000", "bob": "20.000"}
    assert (nlp["cost"], nlp["idle_cost"], nlp["mean_utilization"], nlp["idle_cost_complete"]) == (
        "12.50",
        "0.00",
        "1.0000",
        True,
    )
    totals = report["totals"]
    assert (totals["gpu_hours"], totals["cost"], totals["idle_cost"], totals["mean_utilization"]) == (
        "28.000",
        "65.80",
        "14.98",
        "0.5972",
    )
    assert {m["gpu_model"]: m["gpu_hours"] for m in totals["by_gpu_model"]} == {"A100-80GB": "25.000", "L40S": "3.000"}


@pytest.mark.parametrize(
    "who,query,status,teams",
    [
        ("admin", "", 200, ["nlp", "vision"]),
        ("admin", "&team=nlp", 200, ["nlp"]),
        ("alice", "", 200, ["vision"]),  # the manager: her team only
        ("alice", "&team=vision", 200, ["vision"]),
        ("alice", "&team=nlp", 404, None),  # a team she cannot see
        ("bob", "", 403, None),  # members do not get reports
        ("bob", "&team=vision", 403, None),
        ("charlie", "", 403, None),
        ("charlie", "&team=vision", 404, None),
        (None, "", 401, None),
    ],
)
def test_who_gets_which_report(october, api_as, admin, alice, bob, charlie, who, query, status, teams):
    user = {"admin": admin, "alice": alice, "bob": bob, "charlie": charlie, None: None}[who]
    resp = api_as(user).get(f"{URL}?month=2026-10{query}")
    assert resp.status_code == status, resp.content
    if teams is None:
        assert {"code", "detail", "fields"} <= set(resp.json())
    else:
        assert [t["team"] for t in resp.json()["teams"]] == teams


def test_a_manager_sees_totals_of_her_teams_only(october, api_as, alice):
    totals = api_as(alice).get(f"{URL}?month=2026-10").json()["totals"]
    assert totals["cost"] == "53.30"


@pytest.mark.parametrize("query", ["", "&team=vision"])
def test_the_csv_equals_the_json(october, api_as, admin, query):
    client = api_as(admin)
    report = client.get(f"{URL}?month=2026-10{query}").json()
    resp = client.get(f"{URL}?month=2026-10{query}&format=csv")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/csv")
    assert "attachment" in resp["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(resp.content.decode())))
    fields = ["gpu_hours", "cost", "idle_cost", "mean_utilization", "unknown_utilization_gpu_hours"]

    def same(row: dict, fig: dict) -> None:
        for f in fields:
            assert row[f] == (fig[f] or ""), (row, fig, f)
        assert row["idle_cost_complete"] == str(fig["idle_cost_complete"]).lower()
        assert row["month"] == report["month"] and row["currency"] == report["currency"]

    expected = []
    for team in report["teams"]:
        expected.append((team["team"], "team", "", team))
        expected += [(team["team"], "gpu_model", m["gpu_model"], m) for m in team["by_gpu_model"]]
        expected += [(team["team"], "user", u["user"], u) for u in team["by_user"]]
    expected.append(("*", "total", "", report["totals"]))
    expected += [("*", "gpu_model", m["gpu_model"], m) for m in report["totals"]["by_gpu_model"]]
    assert [(r["team"], r["section"], r["key"]) for r in rows] == [e[:3] for e in expected]
    for row, (_, _, _, fig) in zip(rows, expected, strict=True):
        same(row, fig)


@pytest.mark.parametrize(
    "query,status,field",
    [
        ("?month=2026-13", 400, "month"),
        ("?month=2026-1", 400, "month"),
        ("?month=20261", 400, "month"),
        ("?month=2099-01", 400, "month"),  # the future
        ("?month=2026-10&format=xml", 400, "format"),
        ("?month=2026-10&team=Not A Slug", 400, "team"),
        ("?month=2026-10&team=nope", 404, None),
    ],
)
def test_bad_input(october, api_as, admin, query, status, field):
    resp = api_as(admin).get(f"{URL}{query}")
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"].startswith("application/json")
    body = resp.json()
    assert {"code", "detail", "fields"} <= set(body)
    if field:
        assert field in body["fields"]


def test_csv_errors_are_json(october, api_as, bob):
    resp = api_as(bob).get(f"{URL}?month=2026-10&format=csv")
    assert resp.status_code == 403
    assert resp.json()["code"] == "forbidden"


def test_without_a_month_it_is_the_current_one(october, api_as, admin):
    from apps.billing.selectors import current_month, month_label

    assert api_as(admin).get(URL).json()["month"] == month_label(current_month())


@pytest.mark.django_db
def test_csv_format_errors_and_options_answer_json_in_error_shape(admin, api_as):
    client = api_as(admin)
    bad = client.get("/api/v1/reports/monthly/?month=2020-13&format=csv")
    assert bad.status_code == 400
    assert bad["Content-Type"].startswith("application/json")
    assert bad.json()["code"] == "invalid"
    options = client.options("/api/v1/reports/monthly/?format=csv")
    assert options.status_code == 200
    assert options["Content-Type"].startswith("application/json")
