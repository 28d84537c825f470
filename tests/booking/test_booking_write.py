"""The booking's one-statement write (services.booking_write) against the models: it writes every column of each
row it inserts, a booking read back equals what the service built in Python, and the audit entry equals what the
audit service writes for the same change (no string rebuilt in SQL can drift from the model's `__str__`)."""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.db import models
from psycopg import _queries as psycopg_queries

from apps.audit.models import AuditEvent
from apps.audit.services import audit_event, audit_record
from apps.booking import quota as quota_math
from apps.booking import services
from apps.booking.models import Allocation, AllocationKind, QuotaHold, Reservation
from apps.booking.services.allocations import allocation_rows
from apps.booking.services.booking_write import BookingRows, booking_statement
from apps.booking.services.quotas import UsageRow, hold_row
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


def _concrete(model: type[models.Model], *, with_pk: bool) -> list[str]:
    return [str(f.column) for f in model._meta.concrete_fields if with_pk or not f.primary_key]


def _inserted_columns(sql: str) -> dict[str, list[str]]:
    return {
        table: [c.strip().strip('"') for c in cols.split(",")]
        for table, cols in re.findall(r'INSERT INTO "(\w+)" \(([^)]*)\)', sql)
    }


def test_the_statement_writes_every_column_of_every_row(vision: Any, alice: Any, fleet: dict[str, Any]) -> None:
    start, end = slot()
    gpu_ids = [fleet["gpus"]["big/0"].pk, fleet["gpus"]["big/1"].pk]
    reservation = Reservation(pk=10**9, team=vision, user=alice, gpu_count=2, start=start, end=end, booked_end=end)
    rows = BookingRows(
        reservation=reservation,
        allocations=allocation_rows(
            gpu_ids=gpu_ids, team_id=vision.pk, user=alice, start=start, end=end,
            kind=AllocationKind.RESERVATION, reservation_id=reservation.pk,
        ),
        hold=hold_row(
            team_id=vision.pk, kind=AllocationKind.RESERVATION, reservation_id=reservation.pk, gpu_count=2,
            hourly_rate=Decimal("5"), start=start, end=end,
        ),
        extra=[AuditEvent(action="reservation.create", team_id=vision.pk)],
    )  # fmt: skip
    month = date(start.year, start.month, 1)
    sql, params, expected = booking_statement(
        rows,
        usage={month: UsageRow(id=1, month=month, used=quota_math.Amount())},
        amounts={month: quota_math.Amount(Decimal("4"), Decimal("10"))},
    )
    assert _inserted_columns(sql) == {
        Reservation._meta.db_table: _concrete(Reservation, with_pk=True),
        Allocation._meta.db_table: _concrete(Allocation, with_pk=False),
        QuotaHold._meta.db_table: _concrete(QuotaHold, with_pk=False),
        AuditEvent._meta.db_table: _concrete(AuditEvent, with_pk=False),
    }
    assert set(re.findall(r"%\((\w+)\)s", sql)) == set(params)
    assert expected == [1, 2, 1, 1, 1]


@pytest.mark.parametrize("gpu_count", [1, 8])
def test_the_statement_stays_within_what_psycopg_keeps_parsed(
    gpu_count: int, vision: Any, alice: Any, fleet: dict[str, Any]
) -> None:
    """psycopg parses a statement's placeholders again on every execution when it is long or has many parameters;
    a booking's statement of up to 8 GPUs stays under both limits (equal values are sent once)."""
    start, end = slot()
    reservation = Reservation(pk=10**9, team=vision, user=alice, gpu_count=gpu_count, start=start, end=end)
    gpu_ids = [g.pk for g in list(fleet["gpus"].values())[:gpu_count]]
    rows = BookingRows(
        reservation=reservation,
        allocations=allocation_rows(
            gpu_ids=gpu_ids, team_id=vision.pk, user=alice, start=start, end=end,
            kind=AllocationKind.RESERVATION, reservation_id=reservation.pk,
        ),
        hold=hold_row(
            team_id=vision.pk, kind=AllocationKind.RESERVATION, reservation_id=reservation.pk, gpu_count=gpu_count,
            hourly_rate=Decimal("5"), start=start, end=end,
        ),
        extra=[audit_event(actor=alice, action="reservation.create", target=reservation, data={"gpus": []})],
    )  # fmt: skip
    month = date(start.year, start.month, 1)
    sql, params, _ = booking_statement(
        rows,
        usage={month: UsageRow(id=1, month=month, used=quota_math.Amount())},
        amounts={month: quota_math.Amount(Decimal("4"), Decimal("10"))},
    )
    assert len(params) <= psycopg_queries.MAX_CACHED_STATEMENT_PARAMS
    assert len(sql) <= psycopg_queries.MAX_CACHED_STATEMENT_LENGTH


def _row(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_a_booking_read_back_equals_what_the_service_built(vision: Any, alice: Any, fleet: dict[str, Any]) -> None:
    start, end = slot()
    result = services.reservation_create(
        user=alice, team=vision, start=start, end=end, gpus=["GPU-big-0", "GPU-big-1"], note="a note"
    )
    built = result.reservation
    stored = Reservation.objects.get(pk=built.pk)
    assert _row(stored) == _row(built)
    for allocation in Allocation.objects.filter(reservation=stored):
        assert (allocation.team_id, allocation.user_id, allocation.kind, allocation.start, allocation.end) == (
            vision.pk, alice.pk, AllocationKind.RESERVATION, start, end,
        )  # fmt: skip
        assert allocation.active and allocation.created_at is not None and allocation.ended_at is None
    hold = QuotaHold.objects.get(reservation=stored)
    assert (hold.gpu_count, hold.hourly_rate, hold.start, hold.end, hold.active) == (2, Decimal("5"), start, end, True)


def test_the_audit_entry_equals_what_the_audit_service_writes(vision: Any, alice: Any, fleet: dict[str, Any]) -> None:
    start, end = slot()
    result = services.reservation_create(user=alice, team=vision, start=start, end=end, gpus=["GPU-big-0"])
    stored = Reservation.objects.get(pk=result.reservation.pk)
    written = AuditEvent.objects.get(action="reservation.create", target_id=str(stored.pk))
    reference = audit_record(actor=alice, action="reference", target=stored)
    same = ("actor_id", "target_type", "target_id", "target_repr", "team_id")
    assert {k: getattr(written, k) for k in same} == {k: getattr(reference, k) for k in same}
    assert written.target_repr == str(stored)
    assert written.data["gpus"] == ["GPU-big-0"] and written.data["status"] == "booked"
