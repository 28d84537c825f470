"""What a refused booking reports: the slots it clashed with, shown as much as the viewer may see."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connection

from apps.accounts.types import AnyUser
from apps.core.errors import Conflict

MAX_CONFLICTS_SHOWN = 50
HELD = "Some of these GPUs are already held in that time."
LAYOUT_CHANGED = (
    "The layout of these GPUs changed while this booking was placed (a GPU split in shares, repartitioned or put in "
    "MIG mode): look at the GPUs again and book what they give now."
)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Slot:
    """An allocation as a conflict report needs it."""

    gpu_id: int
    gpu_uuid: str
    gpu_index: int
    node: str
    team_id: int
    team: str
    start: datetime
    end: datetime
    kind: str
    reservation_id: int | None
    job_id: int | None
    user: str | None


def describe_slots(
    slots: Iterable[Slot], *, team_id: int | None, viewer: AnyUser | None = None
) -> list[dict[str, Any]]:
    """Clashing slots as shown to a client: the requesting team's own with details, other teams' with the team
    only (admins see details)."""
    is_admin = viewer is not None and viewer.is_staff
    out: list[dict[str, Any]] = []
    for a in slots:
        slot: dict[str, Any] = {
            "gpu": a.gpu_uuid,
            "node": a.node,
            "gpu_index": a.gpu_index,
            "start": iso(a.start),
            "end": iso(a.end),
            "team": a.team,
        }
        if a.team_id == team_id or is_admin:
            slot.update({"kind": a.kind, "reservation_id": a.reservation_id, "job_id": a.job_id, "user": a.user})
        out.append(slot)
        if len(out) >= MAX_CONFLICTS_SHOWN:
            break
    return out


_CLASHES_SQL = """
SELECT a.gpu_id, g.uuid, COALESCE(p."index", g."index"), n.name, a.team_id, t.slug, a.start, a."end", a.kind,
       a.reservation_id, a.job_id, u.username
FROM booking_allocation a
JOIN fleet_gpu g ON g.id = a.gpu_id JOIN fleet_node n ON n.id = g.node_id JOIN accounts_team t ON t.id = a.team_id
LEFT JOIN fleet_gpu p ON p.id = g.parent_id
LEFT JOIN auth_user u ON u.id = a.user_id
WHERE a.active AND a.gpu_id = ANY(%s) AND a.start < %s AND a."end" > %s
ORDER BY a.gpu_id, a.start
LIMIT %s
"""


def clashes(gpu_ids: Collection[int], start: datetime, end: datetime) -> list[Slot]:
    """Active allocations of these GPUs overlapping [start, end) (one plain query, for conflict reports)."""
    ids = [int(i) for i in gpu_ids]
    if not ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_CLASHES_SQL, [ids, end, start, MAX_CONFLICTS_SHOWN])
        return [Slot(*row) for row in cursor.fetchall()]


def held_sql(*, gpu: str, start: str, end: str) -> str:
    """SQL that is true when an active allocation of GPU `gpu` overlaps [`start`, `end`) (SQL expressions or
    placeholders).

    It reads as few allocations as the GPU lookup does (migration booking 0005 explains the shape): active
    allocations of one GPU never overlap, so those clashing with [start, end) are the ones ending inside
    (start, end] and at most the first one ending after `end`; empty allocations (start = end) are skipped where
    they could hide the one after them."""
    # The arguments are this package's SQL, never values. One line: a booking's statement stays short.
    return " ".join(
        f"""(EXISTS (SELECT 1 FROM booking_allocation a
                WHERE a.gpu_id = {gpu} AND a.active AND a."end" > {start} AND a."end" <= {end})
     OR EXISTS (SELECT 1 FROM (SELECT a.start FROM booking_allocation a
                               WHERE a.gpu_id = {gpu} AND a.active AND a."end" > {end} AND a.start < a."end"
                               ORDER BY a."end" LIMIT 1) b
                WHERE b.start < {end}))""".split()  # noqa: S608
    )


def is_exclusion_violation(exc: IntegrityError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "23P01" or "booking_allocation_no_overlap" in str(exc)


def held_conflict(slots: Iterable[Slot] = (), *, team_id: int | None = None, viewer: AnyUser | None = None) -> Conflict:
    """The 409 for GPUs already held, naming the clashing slots the viewer may see."""
    return Conflict(HELD, extra={"conflicts": describe_slots(slots, team_id=team_id, viewer=viewer)})


def refused_conflict(slots: list[Slot], *, team_id: int | None = None, viewer: AnyUser | None = None) -> Conflict:
    """The 409 for a booking statement that wrote nothing: the GPUs were held, or, with nothing holding them, one
    of them was laid out anew since the booking read it (`booking_write`'s layout guard)."""
    if not slots:
        return Conflict(LAYOUT_CHANGED, extra={"conflicts": [], "layout_changed": True})
    return held_conflict(slots, team_id=team_id, viewer=viewer)
