"""Reads for booking: policy, free GPUs and availability, reservations a user may see, timelines, quotas."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Prefetch, Q, QuerySet, Sum, prefetch_related_objects
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import managed_team_ids_of, team_ids_of
from apps.accounts.types import AnyUser, User
from apps.booking import quota as quota_math
from apps.booking.models import (
    Allocation,
    AllocationKind,
    BookingPolicy,
    CalendarFeed,
    MaintenanceWindow,
    Quota,
    QuotaUsage,
    Reservation,
    ReservationStatus,
)
from apps.booking.placement import shares_needed
from apps.core.ttlcache import TTLCache
from apps.fleet.models import DeviceKind, Gpu, GpuModel, GpuStatus, NodeStatus

# Every booking reads the policy; an admin's change shows within the TTL (admin.py clears it at once).
_policy_cache: TTLCache[int, BookingPolicy] = TTLCache(ttl_s=5.0, maxsize=1)


def _load_policy() -> BookingPolicy:
    policy, _ = BookingPolicy.objects.get_or_create(pk=1)
    return policy


def booking_policy(*, fresh: bool = False) -> BookingPolicy:
    """The booking policy (row pk=1, created with defaults on first use), cached in-process for a few seconds."""
    if fresh:
        policy = _load_policy()
        _policy_cache.set(1, policy)
        return policy
    return _policy_cache.get_or_set(1, _load_policy)


def policy_cache_clear() -> None:
    _policy_cache.clear()


def team_for_booking(*, slug: str, user: AnyUser) -> Team | None:
    """The team by slug, annotated with `is_member` (whether `user` belongs to it), in one hand-written query:
    every booking and job submission makes it, and compiling the ORM's version cost more than running it. Served
    from the web process's row cache where it may be (apps/core/rowcache.py)."""
    from apps.accounts.models import Membership
    from apps.core import rawsql, rowcache

    cols = rawsql.columns(Team, "t")
    # Table and column names from the models' metadata; the user and slug are parameters.
    sql = f"SELECT {cols.sql}, EXISTS (SELECT 1 FROM {Membership._meta.db_table} m WHERE m.team_id = t.id "  # noqa: S608
    sql += f"AND m.user_id = %s) FROM {Team._meta.db_table} t WHERE t.slug = %s"
    user_id = getattr(user, "pk", None) or 0
    row = rowcache.fetch_one(("team", slug, user_id), sql, [user_id, slug])
    if row is None:
        return None
    team: Team = cols.load(row)
    team.is_member = bool(row[cols.width])  # type: ignore[attr-defined]
    return team


def local_tz() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


# --- GPUs: eligible, busy, free --------------------------------------------------------------------------


def bookable_gpus(*, model: GpuModel | None = None, include_offline: bool = False) -> QuerySet[Gpu]:
    """GPUs that can be booked at all: healthy, on an online node (optionally of one model). `include_offline`:
    also GPUs that are only offline (a node not connected yet), for loading data ahead; never lost ones."""
    if include_offline:
        qs = Gpu.objects.exclude(status=GpuStatus.LOST)
    else:
        qs = Gpu.objects.filter(status=GpuStatus.OK, node__status=NodeStatus.ONLINE)
    if model is not None:
        qs = qs.filter(model=model)
    return qs


def maintenance_blocked_gpu_ids(*, start: datetime, end: datetime, gpu_ids: Iterable[int] | None = None) -> set[int]:
    """Ids of GPUs (among `gpu_ids`, or all) that a maintenance window overlapping [start, end) blocks."""
    windows = list(MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).values_list("gpu_id", "node_id"))
    if not windows:
        return set()
    qs = Gpu.objects.all()
    if gpu_ids is not None:
        qs = qs.filter(pk__in=list(gpu_ids))
    if any(gpu is None and node is None for gpu, node in windows):
        return set(qs.values_list("pk", flat=True))
    node_ids = {node for gpu, node in windows if node is not None}
    blocked = {gpu for gpu, _ in windows if gpu is not None}
    return blocked | set(qs.filter(Q(pk__in=blocked) | Q(node_id__in=node_ids)).values_list("pk", flat=True))


def _whole_held_ids(*, start: datetime, end: datetime) -> set[int]:
    """Ids of GPUs not free whole at some instant of [start, end): held themselves or through a part (a share of a
    split GPU, an instance of a GPU in MIG mode), or blocked by a maintenance window."""
    held: set[int] = set()
    for gpu_id, parent_id in Allocation.objects.active().overlapping(start, end).values_list("gpu_id", "gpu__parent"):
        held.add(parent_id if parent_id is not None else gpu_id)
    return held | maintenance_blocked_gpu_ids(start=start, end=end)


def free_gpus(*, start: datetime, end: datetime, model: GpuModel | None = None) -> list[Gpu]:
    """GPUs that can be booked whole and are free for the whole of [start, end): no active allocation of them or
    of their shares, no maintenance window. A GPU in MIG mode is booked by its instances only: never listed."""
    gpus = bookable_gpus(model=model).filter(mig_mode=False).select_related("node", "model")
    taken = _whole_held_ids(start=start, end=end)
    return [g for g in gpus.order_by("node__name", "index") if g.pk not in taken]


def gpu_availability(*, start: datetime, end: datetime, model: GpuModel | None = None) -> dict[str, Any]:
    """Free and total GPUs that can be booked whole for [start, end), per model and per node (and model on each
    node): a GPU split in shares counts free only while none of its shares is held; GPUs in MIG mode not at all."""
    gpus = bookable_gpus(model=model).filter(mig_mode=False).select_related("node", "model")
    gpus = gpus.order_by("node__name", "index")
    taken = _whole_held_ids(start=start, end=end)
    models: dict[str, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        free = gpu.pk not in taken
        m = models.setdefault(
            gpu.model.name, {"model": gpu.model.name, "total": 0, "free": 0, "max_free_on_one_node": 0}
        )
        m["total"] += 1
        m["free"] += free
        n = nodes.setdefault(gpu.node.name, {"node": gpu.node.name, "total": 0, "free": 0, "models": {}})
        n["total"] += 1
        n["free"] += free
        nm = n["models"].setdefault(gpu.model.name, {"total": 0, "free": 0})
        nm["total"] += 1
        nm["free"] += free
    for node in nodes.values():
        for name, counts in node["models"].items():
            models[name]["max_free_on_one_node"] = max(models[name]["max_free_on_one_node"], counts["free"])
    return {"start": start, "end": end, "models": list(models.values()), "nodes": list(nodes.values())}


# --- Reservations ------------------------------------------------------------------------------------------


def _with_details(qs: QuerySet[Reservation]) -> QuerySet[Reservation]:
    # A part's `gpus` entry names its GPU (`parent`): loaded here, or each part held costs a query of its own.
    return qs.select_related("team", "user", "gpu_model").prefetch_related(
        "allocations__gpu__node", "allocations__gpu__model", "allocations__gpu__parent"
    )


def reservations_visible_to(*, user: AnyUser) -> QuerySet[Reservation]:
    """Reservations of the user's teams (admins: all), with what their rows need preloaded."""
    return _with_details(Reservation.objects.visible_to(user))


def may_end_reservation(*, user: AnyUser, reservation: Reservation) -> bool:
    """Who may cancel or release it: admins, the member who booked it, and the team's managers."""
    if user.is_staff or (reservation.user_id is not None and reservation.user_id == user.pk):
        return True
    return isinstance(user, User) and reservation.team_id in managed_team_ids_of(user)


def reservations_with_details(qs: QuerySet[Reservation]) -> QuerySet[Reservation]:
    """`qs` with what a reservation's API row needs preloaded, in start order. Scoping and filters are the
    caller's (views apply `visible_to` and `filtersets.ReservationFilterSet`)."""
    return _with_details(qs).order_by("start", "id")


def bookable_parts() -> list[dict[str, Any]]:
    """What the Book and job forms offer besides whole GPUs: each MIG profile some GPU is laid out in, and each
    fraction a shared GPU's split makes (1/N, 2/N, ... below 1). `value`: "mig:<profile>" or "share:<fraction>";
    `models`: the models whose GPUs give it (the forms keep the model and the part consistent)."""
    live = Gpu.devices.filter(parent__isnull=False, retired_at__isnull=True, parent__retired_at__isnull=True)
    profiles: dict[str, set[str]] = {}
    for profile, model in live.filter(kind="mig").values_list("mig_profile", "parent__model__name"):
        profiles.setdefault(profile, set()).add(model)
    fractions: dict[float, set[str]] = {}
    split_gpus = Gpu.objects.filter(retired_at__isnull=True, shares__gt=1).values_list("shares", "model__name")
    for n, model in set(split_gpus):
        for k in range(1, n):
            fractions.setdefault(round(k / n, 4), set()).add(model)
    mig = [{"value": f"mig:{p}", "label": f"MIG instance {p}", "models": sorted(profiles[p])} for p in sorted(profiles)]
    shares = [
        {"value": f"share:{f:g}", "label": f"{f:g} of a shared GPU (no memory isolation)", "models": sorted(models)}
        for f, models in sorted(fractions.items())
    ]
    return mig + shares


def timeline(*, user: AnyUser, start: datetime, end: datetime) -> dict[str, Any]:
    """GPUs (rows, by node and model) and what holds them in [start, end). Slots of the user's teams carry
    details; other teams' slots only the team (admins see details everywhere)."""
    gpus = list(Gpu.objects.select_related("node", "model").order_by("node__name", "index"))
    mine = set(team_ids_of(user))
    is_admin = bool(getattr(user, "is_staff", False))
    slots = []
    allocations = (
        Allocation.objects.active()
        .overlapping(start, end)
        .select_related("team", "user", "reservation", "gpu")
        .order_by("gpu_id", "start")
    )
    # A MIG instance or share shows on its GPU's row, in a lane of its own (fractional occupancy).
    lanes: dict[int, int] = {}
    for parent_id in {a.gpu.parent_id for a in allocations if a.gpu.parent_id is not None}:
        lanes[parent_id] = Gpu.devices.filter(parent_id=parent_id, retired_at__isnull=True).count()
    for a in allocations:
        slot: dict[str, Any] = {
            "gpu_id": a.gpu.parent_id or a.gpu_id,
            "start": a.start,
            "end": a.end,
            "team": a.team.slug,
            "mine": a.team_id in mine,
        }
        if a.gpu.parent_id is not None:
            slot.update(
                {
                    "share": float(a.gpu.capacity),
                    "profile": a.gpu.mig_profile or None,
                    "lane": a.gpu.index,
                    "lanes": max(lanes.get(a.gpu.parent_id, 1), a.gpu.index + 1),
                }
            )
        if a.team_id in mine or is_admin:
            slot.update(
                {
                    "kind": a.kind,
                    "reservation_id": a.reservation_id,
                    "job_id": a.job_id,
                    "user": a.user.username if a.user else None,
                    "note": a.reservation.note if a.reservation else "",
                    "status": a.reservation.status if a.reservation else None,
                }
            )
        slots.append(slot)
    maintenance = [
        {
            "start": w.start,
            "end": w.end,
            "gpu_id": w.gpu_id,
            "node": w.node.name if w.node else None,
            "reason": w.reason,
        }
        for w in MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).select_related("node")
    ]
    return {
        "start": start,
        "end": end,
        "gpus": [
            {
                "id": g.pk,
                "uuid": g.uuid,
                "node": g.node.name,
                "node_status": g.node.status,
                "index": g.index,
                "model": g.model.name,
                "status": g.status,
                "bookable": g.status == GpuStatus.OK and g.node.status == NodeStatus.ONLINE,
                "mig_mode": g.mig_mode,
                "shares": g.shares,
            }
            for g in gpus
        ],
        "slots": slots,
        "maintenance": maintenance,
    }


def reservations_due(*, now: datetime) -> bool:
    """Whether a reservation's start or end has come without the lifecycle moving it (services.reservations_tick):
    two indexed EXISTS, cheap enough for the scheduler to ask every pass."""
    due_start = Reservation.objects.filter(status=ReservationStatus.BOOKED, start__lte=now, end__gt=now)
    due_end = Reservation.objects.filter(status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE], end__lte=now)
    return due_start.exists() or due_end.exists()


def reservations_current_and_upcoming(*, user: AnyUser, now: datetime, limit: int = 100) -> list[Reservation]:
    """The user's teams' reservations a job can still run in (booked or active, not yet ended), soonest first:
    what the job form and the home page offer. Admins see their own teams' only, as a member would."""
    # The parts it holds (MIG instances, shares), for `Reservation.size_text`: one query for the page.
    parts = Allocation.objects.filter(
        kind=AllocationKind.RESERVATION, active=True, gpu__parent__isnull=False
    ).select_related("gpu")
    return list(
        Reservation.objects.filter(
            team_id__in=team_ids_of(user),
            status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE],
            end__gt=now,
        )
        .select_related("team", "user", "gpu_model")
        .prefetch_related(Prefetch("allocations", queryset=parts, to_attr="part_allocations"))
        .order_by("start", "id")[:limit]
    )


def reservations_for_calendar(*, user: AnyUser, since: datetime) -> QuerySet[Reservation]:
    """Booked, active and released reservations of the user's teams ending after `since` (for the iCal feed)."""
    return (
        Reservation.objects.filter(team_id__in=team_ids_of(user), end__gt=since)
        .exclude(status=ReservationStatus.CANCELLED)
        .select_related("team", "user", "gpu_model")
        .prefetch_related("allocations__gpu__node", "allocations__gpu__parent__node")
        .order_by("start")
    )


def calendar_last_change(*, user: AnyUser, since: datetime) -> datetime | None:
    """When the reservations of the user's teams ending after `since` last changed (booked, started, released or
    cancelled: cancelled ones leave the feed; its end moved, or moved to other devices), for the iCal feed's
    Last-Modified."""
    from django.db.models import Max
    from django.db.models.functions import Greatest

    # PostgreSQL's GREATEST skips NULLs (a reservation not started or not ended yet).
    last = Reservation.objects.filter(team_id__in=team_ids_of(user), end__gt=since).aggregate(
        last=Greatest(Max("created_at"), Max("activated_at"), Max("ended_at"), Max("changed_at"))
    )["last"]
    return last if isinstance(last, datetime) else None


# --- Quotas ------------------------------------------------------------------------------------------------


def quotas_for(*, team_id: int, months: Sequence[date]) -> dict[date, Quota | None]:
    """The quota that applies to each month: the month's own row, else the team's default (or None).

    Hand-written SQL (every booking and job submission reads it; the compiled ORM query cost more CPU than running
    it); the allowed models are prefetched only when the team has quota rows."""
    from apps.core import rawsql

    cols = rawsql.columns(Quota, "q")
    months = list(months)
    in_months = f" OR q.month IN ({', '.join(['%s'] * len(months))})" if months else ""
    # Table and column names from the model's metadata; the team and months are parameters.
    sql = f"SELECT {cols.sql} FROM {Quota._meta.db_table} q WHERE q.team_id = %s AND (q.month IS NULL{in_months})"  # noqa: S608
    rows = [cols.load(row) for row in rawsql.fetch_all(sql, [team_id, *months])]
    if rows:
        prefetch_related_objects(rows, "allowed_models")
    default = next((r for r in rows if r.month is None), None)
    by_month = {r.month: r for r in rows if r.month is not None}
    return {m: by_month.get(m, default) for m in months}


def usage_by_month(*, team_id: int, months: Sequence[date]) -> dict[date, quota_math.Amount]:
    """What the team has counted against its quota in each month: the sum over the month's usage rows (slots)."""
    rows = (
        QuotaUsage.objects.filter(team_id=team_id, month__in=list(months))
        .values("month")
        .annotate(h=Sum("gpu_hours"), c=Sum("cost"))
        .order_by()
    )
    found = {r["month"]: quota_math.Amount(r["h"], r["c"]) for r in rows}
    return {m: found.get(m, quota_math.Amount()) for m in months}


def limits_of(quota: Quota | None) -> quota_math.Limits:
    if quota is None:
        return quota_math.Limits()
    return quota_math.Limits(
        gpu_hours=quota.gpu_hours,
        max_concurrent_gpus=quota.max_concurrent_gpus,
        budget_soft=quota.budget_soft,
        budget_hard=quota.budget_hard,
        allowed_model_ids=frozenset(m.pk for m in quota.allowed_models.all()),
    )


def allowed_model_names(
    *, team_id: int, at: datetime | None = None, quotas: Mapping[date, Quota | None] | None = None
) -> list[str]:
    """The GPU models the team's quota allows in the month of `at` (default: now); [] when it allows every model.
    `quotas`: what `quotas_for` returned for the team, when the caller has it (read again if it lacks the month)."""
    month = quota_math.month_of(at or timezone.now(), local_tz())
    if quotas is None or month not in quotas:
        quotas = quotas_for(team_id=team_id, months=[month])
    allowed = limits_of(quotas[month]).allowed_model_ids
    if not allowed:
        return []
    return sorted(GpuModel.objects.filter(pk__in=allowed).values_list("name", flat=True))


def team_held_intervals(*, team_id: int, start: datetime, end: datetime) -> list[tuple[datetime, datetime, Decimal]]:
    """(start, end, GPUs) of the team's active allocations overlapping [start, end): a part of a GPU counts its
    fraction (`Gpu.capacity`, what billing charges), so four quarters of a GPU held at once are one GPU."""
    rows = (
        Allocation.objects.active()
        .filter(team_id=team_id)
        .overlapping(start, end)
        .values_list("start", "end", "gpu__capacity")
    )
    return [(lo, hi, Decimal(capacity)) for lo, hi, capacity in rows]


def team_peak_gpus(*, team_id: int, start: datetime, end: datetime) -> Decimal:
    """The most GPUs the team holds at once during [start, end) (active allocations; a part of a GPU counts its
    fraction)."""
    return quota_math.peak_concurrency(team_held_intervals(team_id=team_id, start=start, end=end), start, end)


def _money(value: Decimal | None) -> str | None:
    return None if value is None else str(quota_math.q4(value))


def quota_summary(*, team: Team, month: date | None = None) -> dict[str, Any]:
    """A team's quota for a month (default: the current one) with what is booked and what is left."""
    tz = local_tz()
    now = timezone.now()
    month = month or quota_math.month_of(now, tz)
    quota = quotas_for(team_id=team.pk, months=[month])[month]
    limits = limits_of(quota)
    used = usage_by_month(team_id=team.pk, months=[month])[month]
    first, after = quota_math.month_bounds(month, tz)
    to_date_end = min(max(now, first), after)
    # GPUs held now, a part of a GPU counting its fraction (as max_concurrent_gpus counts them).
    held_now = sum(
        Allocation.objects.active()
        .filter(team=team, start__lte=now, end__gt=now)
        .values_list("gpu__capacity", flat=True),
        Decimal(0),
    )
    left = quota_math.remaining(limits, used)
    return {
        "month": month.strftime("%Y-%m"),
        "currency": settings.PORTAL_CURRENCY,
        "limits": {
            "gpu_hours": _money(limits.gpu_hours),
            "max_concurrent_gpus": limits.max_concurrent_gpus,
            "allowed_models": sorted(m.name for m in quota.allowed_models.all()) if quota else [],
            "budget_soft": _money(limits.budget_soft),
            "budget_hard": _money(limits.budget_hard),
        },
        "booked": {"gpu_hours": str(used.gpu_hours), "cost": str(used.cost)},
        "month_to_date_gpu_hours": str(_booked_hours_between(team.pk, first, to_date_end)),
        "remaining": {
            "gpu_hours": _money(left["gpu_hours"]),  # type: ignore[arg-type]
            "budget": _money(left["budget"]),  # type: ignore[arg-type]
            "budget_soft": _money(left["budget_soft"]),  # type: ignore[arg-type]
        },
        "gpus_held_now": quota_math.gpu_number(held_now),
    }


def _booked_hours_between(team_id: int, start: datetime, end: datetime) -> Decimal:
    """GPU-hours the team's active allocations cover within [start, end) (a part of a GPU counts its fraction)."""
    if end <= start:
        return Decimal("0.0000")
    seconds = Decimal(0)
    for lo, hi, gpus in team_held_intervals(team_id=team_id, start=start, end=end):
        seconds += Decimal(str((min(hi, end) - max(lo, start)).total_seconds())) * gpus
    return quota_math.q4(seconds / Decimal(3600))


def quota_preview(
    *,
    team: Team,
    start: datetime | None = None,
    end: datetime | None = None,
    gpu_count: Decimal | int | None = None,
    gpu_model: GpuModel | None = None,
) -> dict[str, Any]:
    """The team's quota for each month [start, end) touches (default: this month), and, given gpu_count, what
    booking that many GPUs of `gpu_model` would count and whether it fits (the page shows it while choosing).
    `gpu_count` may be a fraction: parts of GPUs count theirs (`services.quota_gpus`).
    A preview only: the booking itself checks again under the quota lock."""
    tz = local_tz()
    if start is None or end is None or end <= start:
        months = [quota_math.month_of(timezone.now(), tz)]
    else:
        months = [m for m, _ in quota_math.split_by_month(start, end, tz)]
    quotas = quotas_for(team_id=team.pk, months=months)
    usage = usage_by_month(team_id=team.pk, months=months)
    adds: dict[date, quota_math.Amount] = {}
    if start is not None and end is not None and end > start and gpu_count:
        rate = (gpu_model.hourly_price if gpu_model else Decimal(0)) * gpu_count
        adds = quota_math.hold_amounts(start=start, end=end, gpu_count=gpu_count, hourly_rate=rate, tz=tz)
    out = []
    fits = True
    for month in months:
        limits = limits_of(quotas[month])
        used = usage[month]
        peak = None
        if limits.max_concurrent_gpus is not None and start is not None and end is not None and end > start:
            first, after = quota_math.month_bounds(month, tz)
            peak = team_peak_gpus(team_id=team.pk, start=max(start, first), end=min(end, after))
        add = adds.get(month, quota_math.Amount())
        verdict = quota_math.evaluate(limits=limits, used=used, add=add, peak=peak, add_gpus=gpu_count or 0)
        fits = fits and verdict.ok
        model_ok = gpu_model is None or limits.allows_model(gpu_model.pk)
        fits = fits and model_ok
        quota = quotas[month]
        out.append(
            {
                "month": month.strftime("%Y-%m"),
                "limits": {
                    "gpu_hours": _money(limits.gpu_hours),
                    "max_concurrent_gpus": limits.max_concurrent_gpus,
                    "allowed_models": sorted(m.name for m in quota.allowed_models.all()) if quota else [],
                    "budget_soft": _money(limits.budget_soft),
                    "budget_hard": _money(limits.budget_hard),
                },
                "booked": {"gpu_hours": _money(used.gpu_hours), "cost": _money(used.cost)},
                "remaining": quota_math.remaining_out(verdict.remaining),
                "requested": {"gpu_hours": _money(add.gpu_hours), "cost": _money(add.cost)},
                "exceeded": list(verdict.exceeded) + ([] if model_ok else ["model"]),
                "warnings": list(verdict.warnings),
            }
        )
    return {"team": team.slug, "currency": settings.PORTAL_CURRENCY, "fits": fits, "months": out}


def calendar_feed_user(*, key: str) -> User | None:
    """The active user whose iCal feed key is `key` (looked up by its SHA-256), or None."""
    if not key or len(key) > 128:
        return None
    feed = (
        CalendarFeed.objects.select_related("user")
        .filter(digest=CalendarFeed.key_digest(key), user__is_active=True)
        .first()
    )
    return feed.user if feed else None


@dataclass(frozen=True)
class ReservedPart:
    """A MIG instance or a share of a GPU a reservation holds (a job in the reservation runs on one instance, or on
    as many shares of one GPU as its `gpu_share` makes)."""

    gpu_id: int
    mig_profile: str  # "" for a share
    share: Decimal | None  # the share's fraction of its GPU; None for a MIG instance
    parent_id: int = 0  # the physical GPU

    @property
    def label(self) -> str:
        if self.mig_profile or self.share is None:
            return f"{self.mig_profile} instances"
        return f"{self.share.normalize():f} shares of a GPU"

    def matches(self, mig_profile: str, share: Decimal | None) -> bool:
        """Is this a part a job asking for `mig_profile`, or for `share` of a GPU, runs on (for a share: one of the
        shares that make it, when it is a whole number of them)?"""
        if mig_profile:
            return mig_profile == self.mig_profile
        return share is not None and self.share is not None and self.shares_for(share) is not None

    def shares_for(self, share: Decimal) -> int | None:
        """How many shares like this one make `share` of the GPU (None: not a whole number of them)."""
        if self.share is None or self.share <= 0:
            return None
        return shares_needed(share, round(1 / self.share))  # a share is 1/N of its GPU (capacity, 6 places)


def reserved_share_per_gpu(parts: list[ReservedPart]) -> dict[int, Decimal]:
    """How much of each GPU a reservation's shares make (its parts from `reservation_parts`)."""
    out: dict[int, Decimal] = {}
    for part in parts:
        if part.share is not None and not part.mig_profile:
            out[part.parent_id] = out.get(part.parent_id, Decimal(0)) + part.share
    return out


def reservation_parts(*, reservation_id: int) -> list[ReservedPart]:
    """The parts of GPUs `reservation_id` holds, by GPU id; empty when it holds whole GPUs."""
    rows = (
        Gpu.devices.filter(
            allocations__reservation_id=reservation_id,
            allocations__kind=AllocationKind.RESERVATION,
            allocations__active=True,
            parent__isnull=False,
        )
        .order_by("id")
        .values_list("id", "kind", "mig_profile", "capacity", "parent_id")
        .distinct()
    )
    return [
        ReservedPart(gpu_id, profile or "", None if kind == DeviceKind.MIG else Decimal(capacity), parent_id)
        for gpu_id, kind, profile, capacity, parent_id in rows
    ]
