"""A booking's writes in one statement: the reservation, one allocation per GPU, the quota hold, the quota
counters and any further rows given (the audit entry), all or none.

Why one statement: through the ORM a booking is a query per row and most of its CPU goes to compiling them; here
the writes are one round trip after the locks. The rows are model instances built by the code that owns them
(`allocations.allocation_rows`, `quotas.hold_row`, the audit service) and written column by column from the
models' metadata (`sql.insert_rows`). Every insert is guarded by the clash check, so nothing is written when an
active allocation of one of the GPUs overlaps; the statement's snapshot is taken after the GPU locks
(`quotas.lock_usage`), so it sees every booking committed before them, and the exclusion constraint stays the last
guard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from django.db import connection, models

from apps.booking import quota as quota_math
from apps.booking.models import Allocation, QuotaHold, Reservation
from apps.booking.services.conflicts import held_sql
from apps.booking.services.quotas import UsageRow, usage_add_sql
from apps.booking.services.sql import Params, insert_rows

_UNLESS_CLASH = "NOT EXISTS (SELECT 1 FROM clash)"


@dataclass(frozen=True)
class BookingRows:
    """A booking's unsaved rows; the reservation's primary key is set (drawn by `quotas.lock_usage`)."""

    reservation: Reservation
    allocations: Sequence[Allocation]
    hold: QuotaHold
    extra: Sequence[models.Model] = field(default_factory=tuple)


def booking_statement(
    rows: BookingRows, *, usage: Mapping[date, UsageRow], amounts: Mapping[date, quota_math.Amount]
) -> tuple[str, dict[str, Any], list[int]]:
    """The statement, its parameters and how many rows each of its writes must change (the reservation's first)."""
    r = rows.reservation
    # Every piece is this module's SQL or built from the models' metadata; every value is a parameter.
    p = Params()
    gpus = p([a.gpu_id for a in rows.allocations], "bigint[]")
    held = held_sql(gpu="x.gpu", start=p(r.start, "timestamptz"), end=p(r.end, "timestamptz"))
    # A device whose layout changed after the booking read it (a share retired, a GPU split or put in MIG mode
    # since) counts as a clash too: read here, after the GPUs' locks that a layout change also takes.
    moved = (
        "EXISTS (SELECT 1 FROM fleet_gpu d WHERE d.id = x.gpu AND (d.retired_at IS NOT NULL"
        " OR (d.parent_id IS NULL AND (d.shares > 1 OR d.mig_mode))))"
    )
    ctes = [f"clash AS (SELECT 1 FROM unnest({gpus}) AS x(gpu) WHERE {held} OR {moved} LIMIT 1)"]  # noqa: S608
    expected: list[int] = []
    groups: list[Sequence[models.Model]] = [[r], rows.allocations, [rows.hold]]
    groups += [[obj] for obj in rows.extra]
    for n, objs in enumerate(groups):
        ctes.append(f"w{n} AS ({insert_rows(objs, p, guard=f'WHERE {_UNLESS_CLASH}', suffix='RETURNING 1')})")
        expected.append(len(objs))
    ctes.append(f"w{len(groups)} AS ({usage_add_sql(p, usage, amounts, guard=f'AND {_UNLESS_CLASH}')} RETURNING 1)")
    expected.append(len(amounts))
    counts = ", ".join(f"(SELECT count(*) FROM w{n})" for n in range(len(expected)))  # noqa: S608
    return f"WITH {', '.join(ctes)} SELECT {counts}", p.values, expected


def booking_write(
    rows: BookingRows, *, usage: Mapping[date, UsageRow], amounts: Mapping[date, quota_math.Amount]
) -> bool:
    """Write the booking; False (nothing written) when an active allocation clashes. Call with the team's
    QuotaUsage rows of the months of `amounts` and the GPUs locked (`quotas.lock_usage`)."""
    sql, params, expected = booking_statement(rows, usage=usage, amounts=amounts)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    counts = list(found or ())
    if counts[0] == 0:
        return False
    if counts != expected:  # a write that missed its rows would leave the booking half written: refuse it whole
        raise RuntimeError(f"booking {rows.reservation.pk} wrote {counts} rows, expected {expected}")
    return True
