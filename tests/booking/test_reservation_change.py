"""Moving a reservation's end (PATCH /api/v1/reservations/{id}/): extending into free time, refused into another
holder's time or past the quota, ending it earlier, who may, and what follows (quota counted, agents told, event)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking import services
from apps.booking.models import Allocation, QuotaHold, Reservation, ReservationStatus
from apps.core.errors import Conflict
from apps.events.models import OutboxEvent
from tests.booking.conftest import current_slot, iso, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def _usage(team: Any, month: date) -> tuple[Decimal, Decimal]:
    from apps.booking.selectors import usage_by_month

    used = usage_by_month(team_id=team.pk, months=[month])[month]
    return used.gpu_hours, used.cost


def _month(moment: Any) -> date:
    return timezone.localtime(moment).date().replace(day=1)


def _book(user: Any, team: Any, start: Any, end: Any, gpus: list[str]) -> Reservation:
    return services.reservation_create(user=user, team=team, start=start, end=end, gpus=gpus).reservation


def _snapshot(r: Reservation) -> tuple[Any, ...]:
    r.refresh_from_db()
    hold = QuotaHold.objects.get(reservation=r)
    ends = sorted(Allocation.objects.filter(reservation=r, active=True).values_list("end", flat=True))
    return r.end, r.booked_end, hold.end, tuple(ends)


def test_extend_a_booking_into_free_time(alice, vision, api_as, fleet):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0", "GPU-big-1"])
    before = _usage(vision, _month(start))
    later = end + timedelta(hours=1)
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(later)}, format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert datetime.fromisoformat(body["end"]) == datetime.fromisoformat(body["booked_end"]) == later
    assert _snapshot(r) == (later, later, later, (later, later))
    # Two GPUs for one hour more: 2 GPU-hours at 2.50 each.
    after = _usage(vision, _month(start))
    assert (after[0] - before[0], after[1] - before[1]) == (Decimal("2"), Decimal("5"))
    audit = AuditEvent.objects.get(action="reservation.extend", target_id=str(r.pk))
    assert audit.data["gpus"] == 2
    event = OutboxEvent.objects.get(event_type="reservation.changed")
    assert event.subject == f"reservations/{r.pk}"
    assert event.data["previous_end"].startswith(end.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))
    # The time added is held: nobody else can book it.
    with pytest.raises(Conflict):
        _book(alice, vision, end, later, ["GPU-big-1"])


def test_extension_into_another_booking_is_refused_and_nothing_changes(alice, charlie, vision, nlp, api_as, fleet):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0", "GPU-big-1"])
    _book(charlie, nlp, end + timedelta(minutes=30), end + timedelta(hours=2), ["GPU-big-1"])
    before, used = _snapshot(r), _usage(vision, _month(start))
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")
    assert resp.status_code == 409
    body = resp.json()
    assert body["code"] == "conflict"
    assert [c["gpu"] for c in body["conflicts"]] == ["GPU-big-1"]
    assert _snapshot(r) == before and _usage(vision, _month(start)) == used
    # Up to the other booking's start is free.
    ok = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(minutes=30))}, format="json")
    assert ok.status_code == 200


def test_extension_past_the_quota_is_refused(alice, vision, api_as, fleet, quota):
    quota(gpu_hours=Decimal("5"))
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0", "GPU-big-1"])  # 4 GPU-hours
    before = _snapshot(r)
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")  # 6 > 5
    assert resp.status_code == 403
    body = resp.json()
    assert body["code"] == "quota_exceeded" and body["exceeded"] == ["gpu_hours"]
    assert body["requested"]["gpu_hours"] == "2.0000" and body["remaining"]["gpu_hours"] == "1.0000"
    assert _snapshot(r) == before
    # Half an hour more (1 GPU-hour) is exactly what is left.
    ok = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(minutes=30))}, format="json")
    assert ok.status_code == 200
    assert _usage(vision, _month(start))[0] == Decimal("5")


def test_concurrency_limit_counts_the_added_time(alice, vision, api_as, fleet, quota):
    quota(max_concurrent_gpus=2)
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    _book(alice, vision, end, end + timedelta(hours=2), ["GPU-big-1", "GPU-big-2"])
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")
    assert resp.status_code == 403 and resp.json()["exceeded"] == ["concurrent_gpus"]


def test_end_earlier_gives_the_rest_back(alice, vision, api_as, fleet):
    start, end = slot(hours=4)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    used = _usage(vision, _month(start))
    earlier = start + timedelta(hours=1)
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(earlier)}, format="json")
    assert resp.status_code == 200
    assert _snapshot(r) == (earlier, earlier, earlier, (earlier,))
    after = _usage(vision, _month(start))
    assert (used[0] - after[0], used[1] - after[1]) == (Decimal("3"), Decimal("7.5"))
    assert AuditEvent.objects.filter(action="reservation.shorten", target_id=str(r.pk)).exists()
    # The freed time can be booked by someone else at once.
    _book(alice, vision, earlier, end, ["GPU-big-0"])


@pytest.mark.parametrize(
    "change,message",
    [
        (timedelta(minutes=7), "Must align to 15 minutes."),
        (timedelta(days=14), "A booking lasts at most 336 hours."),
        (-timedelta(hours=2), "A booking lasts at least 15 minutes."),
    ],
)
def test_bad_ends_are_refused_with_the_field(alice, vision, api_as, fleet, change, message):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    before = _snapshot(r)
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + change)}, format="json")
    assert resp.status_code == 400
    assert message in resp.json()["fields"]["end"]
    assert _snapshot(r) == before


def test_bad_bodies_are_400(alice, vision, api_as, fleet):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    client = api_as(alice)
    assert client.patch(f"{URL}{r.pk}/", {}, format="json").json()["fields"]["end"]
    assert client.patch(f"{URL}{r.pk}/", {"end": "tomorrow"}, format="json").status_code == 400
    assert client.patch(f"{URL}{r.pk}/", {"end": None}, format="json").status_code == 400


@pytest.mark.parametrize(
    "who,status", [("owner", 200), ("manager", 200), ("teammate", 403), ("outsider", 404), ("admin", 200)]
)
def test_who_may_change_the_end(alice, bob, charlie, admin, vision, api_as, fleet, who, status):
    start, end = slot(hours=2)
    owner = bob if who != "owner" else alice
    r = _book(owner, vision, start, end, ["GPU-big-0"])
    user = {"owner": alice, "manager": alice, "teammate": bob, "outsider": charlie, "admin": admin}[who]
    if who == "teammate":
        r = _book(alice, vision, start, end, ["GPU-big-1"])  # bob's teammate alice booked it; bob is no manager
    resp = api_as(user).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")
    assert resp.status_code == status, resp.json()


def test_a_read_only_token_may_not(alice, vision, api_as, fleet):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    resp = api_as(alice, ["read"]).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")
    assert resp.status_code == 403


def test_an_ended_reservation_cannot_be_changed(alice, vision, api_as, fleet):
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    services.reservation_end(user=alice, reservation_id=r.pk)
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=1))}, format="json")
    assert resp.status_code == 409 and resp.json()["code"] == "reservation_ended"


def test_extending_an_active_reservation_tells_the_agent(
    alice, vision, api_as, fleet, agent_queue, django_capture_on_commit_callbacks
):
    start, end = current_slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])
    assert r.status == ReservationStatus.ACTIVE
    sent_before = len(agent_queue("big"))  # the hold sent at booking, if any
    later = end + timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(later)}, format="json")
    assert resp.status_code == 200
    messages = agent_queue("big")[sent_before:]
    [message] = messages
    assert message["task"] == "agent.hold_gpus"
    [hold] = message["args"][0]["body"]["holds"]
    assert hold["gpu_uuid"] == "GPU-big-0"
    assert hold["until"].startswith(later.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))


def test_a_share_extends_only_while_a_whole_gpu_booking_leaves_its_time(alice, charlie, vision, nlp, api_as, fleet):
    gpu = fleet["gpus"]["big/3"]
    services.gpu_shares_change(actor=None, gpu_uuid=gpu.uuid, shares=4)
    start, end = slot(hours=2)
    r = services.reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.25").reservation
    # The whole GPU booked right after: the share's device is held by it.
    _book(charlie, nlp, end, end + timedelta(hours=2), [gpu.uuid])
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(minutes=15))}, format="json")
    assert resp.status_code == 409
    ok = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end - timedelta(minutes=15))}, format="json")
    assert ok.status_code == 200


def test_an_extension_over_the_soft_budget_is_made_and_says_so(alice, vision, api_as, fleet, quota):
    quota(budget_soft=Decimal("10"))
    start, end = slot(hours=2)
    r = _book(alice, vision, start, end, ["GPU-big-0"])  # 5.00: under the soft budget
    resp = api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end + timedelta(hours=3))}, format="json")  # 12.50
    assert resp.status_code == 200
    [warning] = resp.json()["warnings"]
    assert warning["code"] == "budget_soft_exceeded" and warning["requested"]["cost"] == "7.5000"
    # Ending it earlier again warns of nothing.
    assert api_as(alice).patch(f"{URL}{r.pk}/", {"end": iso(end)}, format="json").json()["warnings"] == []
