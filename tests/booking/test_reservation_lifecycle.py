"""Lifecycle: booked -> active at start -> released at end; cancel before start; early release frees the GPUs
at once; the tick is idempotent; node agents are told (signed, over the broker); the ended-hook fires once."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.booking import hooks, services
from apps.booking.models import Allocation, Reservation, ReservationStatus
from tests.booking.conftest import book_body, current_slot, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def ended_events() -> Any:
    events: list[hooks.ReservationEnded] = []
    handler = events.append
    hooks.register_reservation_ended(handler)
    yield events
    hooks.unregister_reservation_ended(handler)


def _book(alice: Any, fleet: Any, start: Any, end: Any, gpus: list[str]) -> Reservation:
    return services.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, gpus=gpus
    ).reservation


def test_tick_activates_at_start_and_tells_the_agent(alice, fleet, agent_queue, django_capture_on_commit_callbacks):
    start, end = slot(hours=2)
    r = _book(alice, fleet, start, end, ["GPU-big-0", "GPU-big-1"])
    assert r.status == ReservationStatus.BOOKED
    with django_capture_on_commit_callbacks(execute=True):
        assert services.reservations_tick(now=start - timedelta(seconds=1)) == {"activated": [], "released": []}
        result = services.reservations_tick(now=start)
    assert result["activated"] == [r.pk]
    r.refresh_from_db()
    assert r.status == ReservationStatus.ACTIVE and r.activated_at == start
    [message] = agent_queue("big")
    assert message["task"] == "agent.hold_gpus"
    envelope = message["args"][0]
    assert envelope["node"] == "big" and envelope["sig"]
    holds = envelope["body"]["holds"]
    assert [h["gpu_uuid"] for h in holds] == ["GPU-big-0", "GPU-big-1"]
    assert {h["team"] for h in holds} == {"vision"} and {h["reservation_id"] for h in holds} == {r.pk}
    assert holds[0]["until"].startswith(end.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))
    assert AuditEvent.objects.filter(action="reservation.activate", target_id=str(r.pk)).exists()


def test_tick_releases_at_end_once_and_calls_the_hook(alice, fleet, ended_events, django_capture_on_commit_callbacks):
    start, end = slot(hours=2)
    r = _book(alice, fleet, start, end, ["GPU-big-0"])
    with django_capture_on_commit_callbacks(execute=True):
        services.reservations_tick(now=start)
        first = services.reservations_tick(now=end)
        second = services.reservations_tick(now=end + timedelta(minutes=1))
    assert first["released"] == [r.pk] and second == {"activated": [], "released": []}
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED and r.ended_at == end
    [event] = ended_events
    assert event.reservation_id == r.pk and event.early is False and event.grace_s == 300
    assert event.gpu_ids == (Allocation.objects.get(reservation=r).gpu_id,)


def test_a_missed_start_goes_straight_to_released(alice, fleet, django_capture_on_commit_callbacks):
    start, end = slot(hours=1)
    r = _book(alice, fleet, start, end, ["GPU-big-0"])
    services.reservations_tick(now=end + timedelta(hours=1))
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED


def test_cancel_before_start_frees_the_gpus(alice, bob, api_as, fleet):
    start, end = slot()
    client = api_as(alice)
    r = client.post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json").json()
    resp = client.delete(f"{URL}{r['id']}/")
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelled"
    assert not Allocation.objects.filter(reservation_id=r["id"], active=True).exists()
    again = api_as(bob).post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json")
    assert again.status_code == 201
    assert AuditEvent.objects.filter(action="reservation.cancel", target_id=str(r["id"])).exists()


def test_early_release_frees_the_gpus_at_once(
    alice, charlie, api_as, fleet, agent_queue, ended_events, django_capture_on_commit_callbacks
):
    start, end = current_slot(hours=3)
    client = api_as(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(URL, book_body(start=start, end=end, gpus=["GPU-big-0"]), format="json").json()
    assert r["status"] == "active"
    assert len(agent_queue("big")) == 1
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.delete(f"{URL}{r['id']}/")
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "released"
    released_at = timezone.datetime.fromisoformat(body["end"])
    assert abs((timezone.now() - released_at).total_seconds()) < 10
    [alloc] = Allocation.objects.filter(reservation_id=r["id"])
    assert alloc.active and alloc.end == released_at
    # The agent hears the hold now ends at the release time; the hook is told it ended early.
    hold = agent_queue("big")[0]["args"][0]["body"]["holds"][0]  # LPUSH: the newest first
    assert hold["until"][:19] == released_at.astimezone(UTC).isoformat()[:19]
    [event] = ended_events
    assert event.early is True
    # Another team books the same GPU for the rest of the slot, immediately.
    other = api_as(charlie).post(URL, book_body("nlp", start=start, end=end, gpus=["GPU-big-0"]), format="json")
    assert other.status_code == 201, other.json()


def test_ending_an_ended_reservation_is_409(alice, api_as, fleet):
    start, end = slot()
    client = api_as(alice)
    r = client.post(URL, book_body(start=start, end=end), format="json").json()
    assert client.delete(f"{URL}{r['id']}/").status_code == 200
    again = client.delete(f"{URL}{r['id']}/")
    assert again.status_code == 409 and again.json()["code"] == "reservation_ended"


def test_allocations_for_jobs_share_the_table(alice, fleet, vision):
    from apps.core.errors import Conflict

    start, end = slot(hours=2)
    gpu = fleet["gpus"]["big/0"]
    r = _book(alice, fleet, start, end, ["GPU-big-0"])
    with pytest.raises(Conflict) as exc:
        services.allocations_create(
            gpus=[gpu],
            team=vision,
            user=alice,
            start=start + timedelta(hours=1),
            end=end + timedelta(hours=1),
            kind="job",
            job_id=42,
        )
    assert exc.value.extra["conflicts"][0]["reservation_id"] == r.pk
    # The caller's transaction survives the Conflict (a savepoint), and touching windows are fine.
    [job_alloc] = services.allocations_create(
        gpus=[gpu], team=vision, user=alice, start=end, end=end + timedelta(hours=1), kind="job", job_id=42
    )
    assert job_alloc.job_id == 42
    changed = services.allocation_end(allocation_ids=[job_alloc.pk], at=end + timedelta(minutes=30))
    job_alloc.refresh_from_db()
    assert changed == 1 and job_alloc.end == end + timedelta(minutes=30) and job_alloc.active


def test_job_quota_hold_counts_and_gives_back(alice, fleet, vision, quota):
    from decimal import Decimal

    from apps.core.errors import QuotaExceeded

    quota(gpu_hours=Decimal("10"))
    start, end = slot(hours=4)
    check = services.quota_check_and_hold(
        team=vision,
        gpu_count=2,
        start=start,
        end=end,
        hourly_rate=Decimal("5"),
        kind="job",
        job_id=7,
        check_concurrency=False,
    )
    assert check.hold.job_id == 7
    with pytest.raises(QuotaExceeded) as exc:
        services.quota_check_and_hold(
            team=vision, gpu_count=1, start=start, end=end, hourly_rate=Decimal("5"), kind="job", job_id=8
        )
    assert exc.value.extra["remaining"]["gpu_hours"] == "2.0000"
    # The job ran one hour: the rest comes back.
    services.quota_hold_update(job_id=7, end=start + timedelta(hours=1))
    services.quota_check_and_hold(
        team=vision, gpu_count=2, start=start, end=end, hourly_rate=Decimal("5"), kind="job", job_id=9
    )
    services.quota_hold_release(job_id=9)
    services.quota_hold_release(job_id=9)  # idempotent
    from apps.booking.models import QuotaUsage

    assert QuotaUsage.objects.get(team=vision).gpu_hours == Decimal("2.0000")
