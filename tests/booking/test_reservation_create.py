"""POST /api/v1/reservations/: placement, validation, conflicts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking.models import Allocation, BookingPolicy, MaintenanceWindow, Reservation
from tests.booking.conftest import book_body, iso, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def test_booking_by_model_places_on_one_node_best_fit(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=3), format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["status"] == "booked"
    assert body["gpu_count"] == 3
    # The 4-GPU node fits 3 best; the 8-GPU node stays whole.
    assert {g["node"] for g in body["gpus"]} == {"small"}
    assert [g["index"] for g in body["gpus"]] == [0, 1, 2]
    assert Allocation.objects.filter(reservation_id=body["id"], active=True).count() == 3
    assert AuditEvent.objects.filter(action="reservation.create", target_id=str(body["id"])).exists()


def test_booking_named_gpus(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-big-3", "GPU-big-4"]), format="json")
    assert resp.status_code == 201, resp.json()
    assert sorted(g["uuid"] for g in resp.json()["gpus"]) == ["GPU-big-3", "GPU-big-4"]


def test_overlapping_booking_is_refused_with_slots(alice, charlie, api_as, fleet):
    start, end = slot()
    assert (
        api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json").status_code == 201
    )
    resp = api_as(charlie).post(
        URL,
        book_body("nlp", start=start + timedelta(hours=1), end=end + timedelta(hours=1), gpus=["GPU-big-0"]),
        format="json",
    )
    assert resp.status_code == 409
    body = resp.json()
    assert body["code"] == "conflict"
    [clash] = body["conflicts"]
    # Another team's booking: only the team is named.
    assert clash["gpu"] == "GPU-big-0" and clash["team"] == "vision"
    assert "user" not in clash and "reservation_id" not in clash


def test_own_team_conflict_names_the_reservation(alice, bob, api_as, fleet):
    start, end = slot()
    first = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json").json()
    resp = api_as(bob).post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json")
    assert resp.status_code == 409
    [clash] = resp.json()["conflicts"]
    assert clash["reservation_id"] == first["id"] and clash["user"] == "alice"


@pytest.mark.parametrize(
    "shift,length,status",
    [
        (0, 2, 409),  # identical
        (-1, 2, 409),  # overlaps the start
        (1, 2, 409),  # overlaps the end
        (0.5, 1, 409),  # contained
        (-1, 4, 409),  # contains
        (-2, 2, 201),  # ends exactly when the other starts
        (2, 2, 201),  # starts exactly when the other ends
    ],
)
def test_overlap_rules(alice, api_as, fleet, shift, length, status):
    start, end = slot(hour=10, hours=2)
    client = api_as(alice)
    assert client.post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json").status_code == 201
    s2 = start + timedelta(hours=shift)
    resp = client.post(URL, book_body(start=s2, end=s2 + timedelta(hours=length), gpus=["GPU-big-0"]), format="json")
    assert resp.status_code == status, resp.json()


def test_full_model_is_409_with_free_count(alice, api_as, fleet):
    start, end = slot()
    client = api_as(alice)
    assert (
        client.post(URL, book_body(start=start, end=end, gpu_model="H100-80GB", gpu_count=2), format="json").status_code
        == 201
    )
    resp = client.post(URL, book_body(start=start, end=end, gpu_model="H100-80GB", gpu_count=1), format="json")
    assert resp.status_code == 409
    assert resp.json()["free"] == 0
    assert len(resp.json()["conflicts"]) == 2


def test_eight_gpus_take_the_whole_big_node(alice, api_as, fleet):
    start, end = slot()
    client = api_as(alice)
    small = client.post(URL, book_body(start=start, end=end, gpu_count=2), format="json").json()
    assert {g["node"] for g in small["gpus"]} == {"small"}
    whole = client.post(URL, book_body(start=start, end=end, gpu_count=8), format="json").json()
    assert {g["node"] for g in whole["gpus"]} == {"big"}


def test_spans_nodes_only_when_no_node_has_enough(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=10), format="json")
    assert resp.status_code == 201, resp.json()
    nodes = [g["node"] for g in resp.json()["gpus"]]
    assert nodes.count("big") == 8 and nodes.count("small") == 2


def test_booking_starting_now_is_active(alice, api_as, fleet):
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    resp = api_as(alice).post(URL, book_body(start=start, end=start + timedelta(hours=1)), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["status"] == "active"


@pytest.mark.parametrize(
    "change,field",
    [
        ({"end_before_start": True}, "end"),
        ({"past": True}, "start"),
        ({"misaligned": True}, "start"),
        ({"too_long": True}, "end"),
        ({"too_short": True}, "end"),
        ({"too_far": True}, "start"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": -3}, "gpu_count"),
        ({"gpu_count": 13}, "gpu_count"),
        ({"gpu_model": "TPU-v9"}, "gpu_model"),
        ({"gpu_model": None}, "gpu_model"),
    ],
)
def test_bad_input_is_400_and_writes_nothing(alice, api_as, fleet, change, field):
    start, end = slot()
    if change.pop("end_before_start", False):
        start, end = end, start
    if change.pop("past", False):
        start, end = start - timedelta(days=2), end - timedelta(days=2)
    if change.pop("misaligned", False):
        start = start + timedelta(minutes=7)
    if change.pop("too_long", False):
        end = start + timedelta(days=15)
    if change.pop("too_short", False):
        end = start + timedelta(minutes=0) + timedelta(seconds=0)
        end = start  # zero length
    if change.pop("too_far", False):
        start, end = start + timedelta(days=120), end + timedelta(days=120)
    body = book_body(start=start, end=end, **change)
    resp = api_as(alice).post(URL, body, format="json")
    assert resp.status_code == 400, resp.json()
    assert set(resp.json()) >= {"code", "detail", "fields"}
    assert field in resp.json()["fields"]
    assert not Reservation.objects.exists() and not Allocation.objects.exists()


def test_min_duration_from_policy(alice, api_as, fleet):
    BookingPolicy.objects.update_or_create(pk=1, defaults={"min_duration_minutes": 60})
    start, _ = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=start + timedelta(minutes=30)), format="json")
    assert resp.status_code == 400
    assert "end" in resp.json()["fields"]


def test_unknown_gpu_is_404(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-nope"]), format="json")
    assert resp.status_code == 404
    assert "gpus" in resp.json()["fields"]


def test_offline_gpu_and_offline_node_are_refused(alice, api_as, fleet):
    start, end = slot()
    gpu = fleet["gpus"]["big/1"]
    gpu.status = "lost"
    gpu.save()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-big-1"]), format="json")
    assert resp.status_code == 400 and resp.json()["code"] == "gpu_unavailable"
    node = fleet["nodes"]["small"]
    node.status = "offline"
    node.save()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-small-0"]), format="json")
    assert resp.status_code == 400
    # Placement never picks them either: 7 healthy A100 left on "big".
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=8), format="json")
    assert resp.status_code == 400
    assert not Reservation.objects.exists()


def test_team_the_user_is_not_in_is_403(charlie, api_as, fleet, vision):
    start, end = slot()
    resp = api_as(charlie).post(URL, book_body("vision", start=start, end=end), format="json")
    assert resp.status_code == 403
    assert resp.json()["code"] == "not_a_member"
    assert not Reservation.objects.exists()


def test_unknown_team_is_404(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice).post(URL, book_body("nope", start=start, end=end), format="json")
    assert resp.status_code == 404


def test_maintenance_window_blocks_gpus_and_nodes(alice, api_as, fleet):
    start, end = slot()
    MaintenanceWindow.objects.create(start=start, end=end, node=fleet["nodes"]["big"], reason="firmware")
    client = api_as(alice)
    resp = client.post(URL, book_body(start=start, end=end, gpus=["GPU-big-2"]), format="json")
    assert resp.status_code == 409
    assert resp.json()["conflicts"][0]["maintenance"] is True
    # By model: only the 4 A100 on "small" remain.
    assert client.post(URL, book_body(start=start, end=end, gpu_count=5), format="json").status_code == 409
    after = client.post(URL, book_body(start=end, end=end + timedelta(hours=1), gpus=["GPU-big-2"]), format="json")
    assert after.status_code == 201


def test_admin_may_book_for_any_team(admin, api_as, fleet, vision):
    start, end = slot()
    resp = api_as(admin).post(URL, book_body("vision", start=start, end=end), format="json")
    assert resp.status_code == 201


def test_token_without_reservations_scope_is_403(alice, api_as, fleet):
    start, end = slot()
    resp = api_as(alice, ["read"]).post(URL, book_body(start=start, end=end), format="json")
    assert resp.status_code == 403
    assert resp.json()["code"] == "insufficient_scope"


def test_idempotency_key_books_once(alice, api_as, fleet):
    start, end = slot()
    client = api_as(alice)
    first = client.post(URL, book_body(start=start, end=end), format="json", HTTP_IDEMPOTENCY_KEY="book-1")
    second = client.post(URL, book_body(start=start, end=end), format="json", HTTP_IDEMPOTENCY_KEY="book-1")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Reservation.objects.count() == 1


def test_times_in_response_carry_an_offset(alice, api_as, fleet):
    start, end = slot()
    body = api_as(alice).post(URL, book_body(start=start, end=end), format="json").json()
    assert body["start"].endswith(("Z", "+00:00"))
    assert iso(start)[:16] == body["start"][:16]
