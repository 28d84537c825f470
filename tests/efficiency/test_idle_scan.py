"""The idle scan over real minute rollups: an idle reservation is warned (audit, outbox event, live message),
released after the grace with reason idle (allocations cut, billing stops there), a busy one is left alone, an
unused one is released as unused, an idle job is asked to stop with reason idle and ends cancelled/idle."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.audit.models import AuditEvent
from apps.billing import services as billing
from apps.billing.models import UsageRecord
from apps.booking import services as booking
from apps.booking.models import Allocation, ReservationStatus
from apps.efficiency import services
from apps.efficiency.models import IdleExemption, IdleMark, IdlePolicy, MarkState
from apps.events.models import OutboxEvent
from apps.jobs.models import JobReason, JobState
from apps.jobs.services.reports import final_state_of
from tests.booking.conftest import slot
from tests.efficiency.conftest import write_minutes

pytestmark = pytest.mark.django_db


def _active_reservation(alice: Any, gpus: list[str]) -> Any:
    start, end = slot(hours=4)
    r = booking.reservation_create(
        user=alice, team=alice.memberships.first().team, start=start, end=end, gpus=gpus
    ).reservation
    booking.reservations_tick(now=start)
    r.refresh_from_db()
    assert r.status == ReservationStatus.ACTIVE
    return r


def test_idle_reservation_is_warned_then_reclaimed(alice, fleet, django_capture_on_commit_callbacks):
    r = _active_reservation(alice, ["GPU-big-0", "GPU-big-1"])
    g0, g1 = fleet["gpus"]["big/0"], fleet["gpus"]["big/1"]
    # Busy for 10 minutes (so it is not "unused"), then both GPUs idle and empty.
    for g in (g0, g1):
        write_minutes(g, r.start, 10, util=80, mem=30000)
        write_minutes(g, r.start + timedelta(minutes=10), 30, util=0, mem=0)
    assert services.idle_scan(now=r.start + timedelta(minutes=41)).warned == []  # the window is not full yet

    write_minutes(g0, r.start + timedelta(minutes=40), 30, util=0, mem=0)
    write_minutes(g1, r.start + timedelta(minutes=40), 30, util=2, mem=10)
    at = r.start + timedelta(minutes=71)
    with django_capture_on_commit_callbacks(execute=True):
        result = services.idle_scan(now=at)
    assert result.warned == [f"reservations/{r.pk}"]
    mark = IdleMark.objects.get(kind="reservation", source_id=r.pk)
    assert mark.state == MarkState.WARNED and mark.user_id == alice.pk and not mark.loaded
    assert mark.reclaim_at == at + timedelta(minutes=15)
    event = OutboxEvent.objects.get(event_type="idle.warning", subject=f"reservations/{r.pk}")
    assert event.user_id == alice.pk and event.data["window_minutes"] == 60 and event.data["mean_utilization"] == 1.0
    assert AuditEvent.objects.filter(action="idle.warning", team_id=r.team_id).count() == 1
    # A second scan at the same time changes nothing (idempotent).
    assert services.idle_scan(now=at).warned == []
    # 14 minutes of grace: not yet.
    for g in (g0, g1):
        write_minutes(g, r.start + timedelta(minutes=70), 14, util=0, mem=0)
    assert services.idle_scan(now=at + timedelta(minutes=14)).reclaimed == []

    for g in (g0, g1):
        write_minutes(g, r.start + timedelta(minutes=84), 2, util=0, mem=0)
    at = r.start + timedelta(minutes=87)
    result = services.idle_scan(now=at)
    assert result.reclaimed == [f"reservations/{r.pk}"]
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED and r.released_reason == "idle" and r.end == at
    assert set(Allocation.objects.filter(reservation=r).values_list("end", flat=True)) == {at}
    mark.refresh_from_db()
    # 4 h booked, released after 87 min: 153 min on each of 2 GPUs, at the A100's 2.50 an hour.
    assert mark.state == MarkState.RECLAIMED and str(mark.reclaimed_gpu_hours) == "5.1000"
    assert str(mark.reclaimed_cost) == "12.7500"
    audit = AuditEvent.objects.get(action="reservation.release", target_id=str(r.pk))
    assert audit.actor is None and audit.data["reason"] == "idle" and audit.data["grace_minutes"] == 15
    assert OutboxEvent.objects.filter(event_type="idle.reclaimed").count() == 1
    assert services.idle_scan(now=at + timedelta(minutes=1)).reclaimed == []
    # Billing stops at the release, and the ledger says why on each GPU's last row.
    billing.ledger_close(now=at + timedelta(hours=1))
    rows = list(UsageRecord.objects.filter(source="reservation", source_id=r.pk).order_by("gpu_id", "start"))
    assert rows and max(row.end for row in rows) == at
    assert {(row.gpu_id, row.end_reason) for row in rows if row.end == at} == {(g0.pk, "idle"), (g1.pk, "idle")}
    assert {row.end_reason for row in rows if row.end < at} <= {""}


def test_busy_again_after_a_warning_clears_it(alice, fleet):
    r = _active_reservation(alice, ["GPU-big-2"])
    g = fleet["gpus"]["big/2"]
    write_minutes(g, r.start, 5, util=90, mem=50000)
    write_minutes(g, r.start + timedelta(minutes=5), 65, util=1, mem=100)
    assert services.idle_scan(now=r.start + timedelta(minutes=71)).warned == [f"reservations/{r.pk}"]
    write_minutes(g, r.start + timedelta(minutes=70), 1, util=60, mem=50000)
    result = services.idle_scan(now=r.start + timedelta(minutes=72))
    assert result.cleared == [f"reservations/{r.pk}"] and result.reclaimed == []
    assert IdleMark.objects.get(source_id=r.pk).state == MarkState.CLEARED


def test_loaded_gpu_waits_twice_as_long(alice, fleet):
    r = _active_reservation(alice, ["GPU-big-3"])
    g = fleet["gpus"]["big/3"]
    write_minutes(g, r.start, 2, util=90, mem=50000)
    write_minutes(g, r.start + timedelta(minutes=2), 100, util=0, mem=40000)  # a model held at 0%
    assert services.idle_scan(now=r.start + timedelta(minutes=103)).warned == []
    write_minutes(g, r.start + timedelta(minutes=102), 20, util=0, mem=40000)
    assert services.idle_scan(now=r.start + timedelta(minutes=123)).warned == [f"reservations/{r.pk}"]
    assert IdleMark.objects.get(source_id=r.pk).loaded


def test_unused_reservation_is_released_unused(alice, fleet):
    r = _active_reservation(alice, ["GPU-big-4"])
    write_minutes(fleet["gpus"]["big/4"], r.start, 30, util=0, mem=0)
    result = services.idle_scan(now=r.start + timedelta(minutes=31))
    assert result.unused == [f"reservations/{r.pk}"]
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED and r.released_reason == "unused"
    assert IdleMark.objects.get(source_id=r.pk).state == MarkState.UNUSED
    client = APIClient()
    client.force_authenticate(alice)
    body = client.get(f"/api/v1/reservations/{r.pk}/").json()
    assert body["status"] == "released" and body["released_reason"] == "unused"


def test_policy_off_for_reservations_and_exemptions(alice, fleet, vision):
    r = _active_reservation(alice, ["GPU-big-5"])
    write_minutes(fleet["gpus"]["big/5"], r.start, 2, util=90, mem=50000)
    write_minutes(fleet["gpus"]["big/5"], r.start + timedelta(minutes=2), 80, util=0, mem=0)
    at = r.start + timedelta(minutes=83)
    IdlePolicy.objects.create(team=vision, applies_to=["jobs"])
    assert services.idle_scan(now=at).warned == []
    IdlePolicy.objects.filter(team=vision).update(applies_to=["reservations", "jobs"])
    IdleExemption.objects.create(team=vision, kind="reservation", source_id=r.pk, extra_min=None)
    assert services.idle_scan(now=at).warned == []
    IdleExemption.objects.filter(source_id=r.pk).update(extra_min=30)  # a 90-minute window: not yet
    assert services.idle_scan(now=at).warned == []
    IdleExemption.objects.filter(source_id=r.pk).update(extra_min=10)
    assert services.idle_scan(now=at).warned == [f"reservations/{r.pk}"]


def test_stale_telemetry_decides_nothing(alice, fleet):
    r = _active_reservation(alice, ["GPU-big-6"])
    write_minutes(fleet["gpus"]["big/6"], r.start, 60, util=0, mem=0)
    # The newest minute is 30 minutes old: the node stopped reporting; nothing is decided on old data.
    result = services.idle_scan(now=r.start + timedelta(minutes=90))
    assert result.unused == [] and result.warned == []


def test_idle_stop_ends_a_job_cancelled_with_reason_idle(alice):
    from apps.jobs.models import Job

    job = Job(state=JobState.RUNNING, stop_reason=JobReason.IDLE)
    assert final_state_of(job, "cancelled", "cancelled") == (JobState.CANCELLED, JobReason.IDLE)
