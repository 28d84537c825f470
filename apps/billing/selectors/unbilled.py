"""What is not billed yet: active allocations whose time is not all in the ledger, and their missing pieces.
The ledger closer writes these pieces; live month-to-date figures add them to the ledger's rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from decimal import Decimal

from django.apps import apps as django_apps
from django.db.models import Exists, OuterRef, QuerySet, Subquery

from apps.billing import costing
from apps.billing.costing import Piece
from apps.billing.models import MigProfilePrice, SourceKind, UsageRecord
from apps.billing.selectors.months import current_month, local_tz
from apps.billing.selectors.pricing import PriceBook
from apps.booking.models import Allocation, AllocationKind


@dataclass(frozen=True)
class OpenAllocation:
    """An active allocation with some of its time not in the ledger yet (plain data for the cost functions)."""

    id: int
    gpu_id: int
    gpu_model_id: int
    team_id: int
    user_id: int | None
    source: str
    source_id: int
    start: datetime
    end: datetime  # billable end: its end, or now while it runs
    # The device's fraction of its physical GPU (a MIG instance g/7, a share 1/N, a whole GPU 1) and its MIG
    # profile: a slice bills at the GPU's price x share unless an admin priced the profile (billing.MigProfilePrice).
    share: Decimal = Decimal(1)
    profile: str = ""
    parent_id: int | None = None  # the physical GPU of a MIG instance or share
    # Why it ended early, when the portal ended it (a reservation's released_reason, "idle" for a reclaimed job):
    # the ledger's last row of the allocation says so.
    end_reason: str = ""


def billable_allocations() -> QuerySet[Allocation]:
    """The allocations that bill: active rows. Booking marks a reservation cancelled before it started (or a job
    allocation that never ran) inactive; one released early or a job that ended keeps its row, cut to that time."""
    return Allocation.objects.filter(active=True)


def unbilled_allocations(
    *,
    now: datetime,
    window: tuple[datetime, datetime] | None = None,
    team_ids: Iterable[int] | None = None,
    allocation_ids: Iterable[int] | None = None,
    since: datetime | None = None,
) -> list[OpenAllocation]:
    """Active allocations that started before `now` and whose last piece is not in the ledger (no row ends where
    the allocation ends): running ones, and finished ones the closer has not written yet."""
    fully_billed = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), end=OuterRef("end"))
    # Jobs are read by name: billing sits below jobs in the import graph (jobs prices its work with billing).
    job = django_apps.get_model("jobs", "Job")
    job_reason = Subquery(job.objects.filter(pk=OuterRef("job_id")).values("reason")[:1])
    qs = billable_allocations().filter(start__lt=now).exclude(Exists(fully_billed)).annotate(job_reason=job_reason)
    if window is not None:
        qs = qs.filter(start__lt=window[1], end__gt=window[0])
    if since is not None:
        qs = qs.filter(end__gt=since)
    if team_ids is not None:
        qs = qs.filter(team_id__in=list(team_ids))
    if allocation_ids is not None:
        qs = qs.filter(pk__in=list(allocation_ids))
    out: list[OpenAllocation] = []
    for row in qs.values(
        "id",
        "gpu_id",
        "gpu__model_id",
        "team_id",
        "user_id",
        "kind",
        "reservation_id",
        "job_id",
        "start",
        "end",
        "gpu__capacity",
        "gpu__mig_profile",
        "gpu__parent_id",
        "reservation__released_reason",
        "job_reason",
    ):
        source_id: int | None
        if row["kind"] == AllocationKind.RESERVATION:
            source, source_id = SourceKind.RESERVATION, row["reservation_id"]
            end_reason = row["reservation__released_reason"] or ""
        else:
            source, source_id = SourceKind.JOB, row["job_id"]
            end_reason = "idle" if row["job_reason"] == "idle" else ""
        if source_id is None:
            continue  # a job allocation without its job id cannot be keyed; booking's constraint makes it rare
        out.append(
            OpenAllocation(
                id=row["id"],
                gpu_id=row["gpu_id"],
                gpu_model_id=row["gpu__model_id"],
                team_id=row["team_id"],
                user_id=row["user_id"],
                source=str(source),
                source_id=int(source_id),
                start=row["start"],
                end=min(row["end"], now),
                share=Decimal(row["gpu__capacity"]),
                profile=row["gpu__mig_profile"],
                parent_id=row["gpu__parent_id"],
                end_reason=end_reason if row["end"] <= now else "",
            )
        )
    return out


def billed_starts(allocation_ids: Iterable[int], *, month: date | None = None) -> set[tuple[int, datetime]]:
    """(allocation id, piece start) of the ledger rows these allocations already have."""
    ids = list(allocation_ids)
    if not ids:
        return set()
    qs = UsageRecord.objects.filter(allocation_id__in=ids)
    if month is not None:
        qs = qs.filter(month=month)
    return {(a, s) for a, s in qs.values_list("allocation_id", "start")}


def unbilled_pieces(
    allocations: Sequence[OpenAllocation], *, book: PriceBook, month: date | None = None
) -> list[tuple[OpenAllocation, Piece]]:
    """The pieces of these allocations (up to their billable end) that have no ledger row, optionally only one
    month's."""
    billed = billed_starts([a.id for a in allocations], month=month)
    profile_prices = mig_profile_prices() if any(a.profile for a in allocations) else {}
    out: list[tuple[OpenAllocation, Piece]] = []
    for alloc in allocations:
        for piece in book.split(alloc.gpu_model_id, alloc.start, alloc.end):
            if month is not None and piece.month != month:
                continue
            if (alloc.id, piece.start) not in billed:
                out.append((alloc, slice_piece(piece, alloc, profile_prices)))
    return out


def mig_profile_prices() -> dict[tuple[int, str], Decimal]:
    """Admins' prices of MIG profiles, by (GPU model id, profile): the hourly price of one such instance."""
    return {
        (m, p): price for m, p, price in MigProfilePrice.objects.values_list("gpu_model_id", "profile", "hourly_price")
    }


def hourly_cost(
    *,
    gpu_model_id: int,
    profile: str,
    share: Decimal,
    gpu_hourly_price: Decimal,
    profile_prices: dict[tuple[int, str], Decimal],
) -> Decimal:
    """What an hour of a device costs, by the rule `slice_piece` bills with: the admin's price of its MIG profile,
    else its GPU model's hourly price x its share of the GPU (1 for a whole GPU). For live rates and a job's cost
    so far, so they agree with the ledger."""
    override = profile_prices.get((gpu_model_id, profile)) if profile else None
    return override if override is not None else gpu_hourly_price * share


def slice_piece(piece: Piece, alloc: OpenAllocation, profile_prices: dict[tuple[int, str], Decimal]) -> Piece:
    """A piece of a MIG instance or share as billed: GPU-seconds = seconds x share, cost = the GPU's price x share
    x seconds, or the admin's price of the profile x seconds. A whole GPU's piece is unchanged."""
    override = profile_prices.get((alloc.gpu_model_id, alloc.profile)) if alloc.profile else None
    if override is None and alloc.share == 1:
        return piece
    seconds = Decimal(piece.seconds) * alloc.share
    if override is not None:
        cost = costing.cost_of(piece.seconds, override)
    else:
        cost = costing.cost_of(seconds, piece.hourly_price)
    return replace(piece, seconds=int(seconds.to_integral_value()), cost=cost)


def teams_with_unbilled_time(*, now: datetime) -> list[int]:
    """Teams whose month-to-date figures move: a running allocation, or one not fully written yet."""
    first, _after = costing.month_bounds(current_month(now=now), local_tz())
    fully_billed = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), end=OuterRef("end"))
    return sorted(
        set(
            billable_allocations()
            .filter(start__lt=now, end__gt=first)
            .exclude(Exists(fully_billed))
            .values_list("team_id", flat=True)
            .distinct()
        )
    )
