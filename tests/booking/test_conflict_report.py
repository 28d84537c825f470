"""What a refused booking of named GPUs reports. The clashing allocations come with the GPU lookup (one query,
`gpus.gpus_by_uuid`); the report must equal the one built by the separate `conflicts.clashes` query (what a
placement's refusal reports): the same slots, ordered by GPU and start, capped, other teams' shown by team only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from apps.booking import services
from apps.booking.models import Reservation
from apps.booking.services import conflicts, gpus, reservations
from tests.booking.conftest import book_body, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def _book(client: Any, team: str, gpus: list[str], start: Any, end: Any) -> None:
    resp = client.post(URL, book_body(team, start=start, end=end, gpus=gpus), format="json")
    assert resp.status_code == 201, resp.json()


@pytest.fixture
def crowded(alice: Any, charlie: Any, api_as: Any, fleet: Any) -> dict[str, Any]:
    """GPU-big-0: vision 10-11, nlp 11-12, vision 12-13; GPU-big-1: nlp 10-13 (ids: big-0 < big-1)."""
    day, _ = slot(hour=10, hours=1)
    h = timedelta(hours=1)
    a, c = api_as(alice), api_as(charlie)
    _book(a, "vision", ["GPU-big-0"], day, day + h)
    _book(c, "nlp", ["GPU-big-0"], day + h, day + 2 * h)
    _book(a, "vision", ["GPU-big-0"], day + 2 * h, day + 3 * h)
    _book(c, "nlp", ["GPU-big-1"], day, day + 3 * h)
    return {"start": day, "end": day + 3 * h, "fleet": fleet}


def _expected(crowded: dict[str, Any], viewer: Any, team: Any, uuids: list[str]) -> list[dict[str, Any]]:
    ids = [crowded["fleet"]["gpus"][u.removeprefix("GPU-").replace("-", "/")].pk for u in uuids]
    slots = conflicts.clashes(ids, crowded["start"], crowded["end"])
    return services.describe_slots(slots, team_id=team.pk, viewer=viewer)


def test_report_equals_the_separate_query(alice: Any, vision: Any, api_as: Any, crowded: dict[str, Any]) -> None:
    # Named in reverse id order: the report is still ordered by GPU, then start.
    body = book_body("vision", start=crowded["start"], end=crowded["end"], gpus=["GPU-big-1", "GPU-big-0"])
    resp = api_as(alice).post(URL, body, format="json")
    assert resp.status_code == 409, resp.json()
    conflicts = resp.json()["conflicts"]
    assert conflicts == _expected(crowded, alice, vision, ["GPU-big-0", "GPU-big-1"])
    assert [(c["gpu"], c["team"]) for c in conflicts] == [
        ("GPU-big-0", "vision"),
        ("GPU-big-0", "nlp"),
        ("GPU-big-0", "vision"),
        ("GPU-big-1", "nlp"),
    ]
    own = [c for c in conflicts if c["team"] == "vision"]
    theirs = [c for c in conflicts if c["team"] == "nlp"]
    assert all(c["user"] == "alice" and c["kind"] == "reservation" for c in own)
    assert {c["reservation_id"] for c in own} == set(
        Reservation.objects.filter(team=vision).values_list("pk", flat=True)
    )
    assert all("user" not in c and "reservation_id" not in c for c in theirs)
    assert conflicts[0]["start"].endswith("Z") and conflicts[-1]["end"].endswith("Z")


def test_report_needs_no_second_query(
    alice: Any, vision: Any, api_as: Any, crowded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _expected(crowded, alice, vision, ["GPU-big-0", "GPU-big-1"])

    def no_second_query(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the clashes were to come with the GPUs")

    for module in (conflicts, gpus, reservations):
        monkeypatch.setattr(module, "clashes", no_second_query)
    body = book_body("vision", start=crowded["start"], end=crowded["end"], gpus=["GPU-big-0", "GPU-big-1"])
    resp = api_as(alice).post(URL, body, format="json")
    assert resp.status_code == 409, resp.json()
    assert resp.json()["conflicts"] == expected


def test_report_is_capped_like_the_separate_query(
    alice: Any, vision: Any, api_as: Any, crowded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (conflicts, gpus):
        monkeypatch.setattr(module, "MAX_CONFLICTS_SHOWN", 2)
    expected = _expected(crowded, alice, vision, ["GPU-big-0", "GPU-big-1"])
    assert len(expected) == 2
    info = gpus.gpus_by_uuid(["GPU-big-0", "GPU-big-1"], crowded["start"], crowded["end"])
    assert [len(info[u].clashes or ()) for u in ("GPU-big-0", "GPU-big-1")] == [2, 1]
    body = book_body("vision", start=crowded["start"], end=crowded["end"], gpus=["GPU-big-1", "GPU-big-0"])
    resp = api_as(alice).post(URL, body, format="json")
    assert resp.status_code == 409, resp.json()
    assert resp.json()["conflicts"] == expected


def test_free_gpu_has_no_clashes(crowded: dict[str, Any]) -> None:
    info = gpus.gpus_by_uuid(["GPU-big-2", "GPU-big-0"], crowded["start"], crowded["end"])
    assert info["GPU-big-2"].clashes == () and info["GPU-big-2"].busy is False
    assert info["GPU-big-0"].busy is True
    # A window that only touches the bookings (end == next start) clashes with nothing.
    before = gpus.gpus_by_uuid(["GPU-big-0"], crowded["start"] - timedelta(hours=1), crowded["start"])
    assert before["GPU-big-0"].clashes == ()
