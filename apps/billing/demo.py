"""Demo cost history (embedded default only): a price history, two months and the current month so far of
reservations on the fleet's GPUs (on the instances of a GPU in MIG mode and the shares of a GPU split in shares),
hourly telemetry rollups shaped by the real per-container duty cycles of the Alibaba GenAI trace
(workers/gpu/profiles/alibaba_genai_2026.json), the quota holds booking would have kept for them, the ledger rows
the closer writes for them, and the past months closed. Idempotent: the history is added once (marked by its
reservations' note); prices and month closes are get-or-create. A few seconds: everything is bulk-inserted.

Before the local agent has ever registered, there are no GPUs: the history is then put on the GPUs the simulated
local agent will register, models included (apps.fleet.demo), which registration adopts by uuid; with real GPUs
those rows are retired on registration and keep the history. Every model with a GPU gets a price timeline, so the
Prices page lists each model the reports bill.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.billing import costing, selectors, services
from apps.billing.models import Price
from apps.booking.models import Allocation, AllocationKind, Reservation, ReservationStatus
from apps.fleet.models import DeviceKind, Gpu, GpuModel

logger = logging.getLogger(__name__)

HISTORY_NOTE = "demo history"
SEED = 2026
# Who books, how much: (team, user, share of bookings).
BOOKERS = [("vision", "alice", 0.42), ("vision", "bob", 0.36), ("nlp", "carol", 0.22)]
# The A100 used to cost more: a price change in the middle of the month before last.
PREVIOUS_PRICE_FACTOR = Decimal("1.15")
NO_TELEMETRY_SHARE = 0.05  # bookings whose node agent was down: utilization unknown, flagged in reports


def _profiles() -> list[list[int]]:
    from workers.gpu.simulated import PROFILE_FILE

    try:
        data = json.loads(PROFILE_FILE.read_text())
        return [p["util"] for p in data["profiles"].values() if p.get("util")]
    except (OSError, ValueError, KeyError):
        return [[10, 40, 0, 70, 5, 0, 25]]


def _gpus() -> list[Gpu]:
    """The GPUs to put history on: every live GPU; without any, the local agent's future ones."""
    from apps.fleet.demo import placeholder_gpus

    gpus = list(Gpu.objects.filter(retired_at__isnull=True).select_related("model").order_by("node__name", "index"))
    return gpus or placeholder_gpus()


def _targets(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Where the history's bookings go: each GPU, or for a GPU in MIG mode its instances and for a GPU split in
    shares its shares (what booking hands out on them), so the reports show slices billed at their fraction."""
    parts: dict[int, list[Gpu]] = {}
    physical = [g.pk for g in gpus if g.pk is not None]
    devices = Gpu.devices.filter(parent_id__in=physical, retired_at__isnull=True).select_related("model")
    for device in devices.order_by("parent_id", "uuid"):
        assert device.parent_id is not None
        parts.setdefault(device.parent_id, []).append(device)
    return [target for g in gpus for target in parts.get(g.pk, [g])]


def _prices(models: Sequence[GpuModel], history_start: datetime) -> None:
    """A price timeline per model: the current list price, and for the A100 a higher price before mid-month."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    tz = selectors.local_tz()
    change = costing.local_midnight(history_start.astimezone(tz).date().replace(day=15), tz)
    for model in models:
        if Price.objects.filter(gpu_model=model).exists():
            continue
        if model.name.startswith("A100"):
            Price.objects.create(
                gpu_model=model,
                valid_from=epoch,
                hourly_price=(model.hourly_price * PREVIOUS_PRICE_FACTOR).quantize(Decimal("0.0001")),
                note="demo: the old A100 price",
            )
            Price.objects.create(gpu_model=model, valid_from=change, hourly_price=model.hourly_price, note="demo")
        else:
            Price.objects.create(gpu_model=model, valid_from=epoch, hourly_price=model.hourly_price, note="demo")


def _plan(gpus: Sequence[Gpu], start: datetime, end: datetime, rng: random.Random) -> list[tuple[int, int, Any, Any]]:
    """(gpu index in `gpus`, booker index, start, end): back-to-back bookings with gaps, busier on weekdays."""
    out = []
    tz = selectors.local_tz()
    for g in range(len(gpus)):
        t = start + timedelta(hours=rng.uniform(0, 24))
        while True:
            local = t.astimezone(tz)
            weekend = local.weekday() >= 5
            gap_h = rng.expovariate(1 / (60 if weekend else 32))
            t = (t + timedelta(hours=gap_h)).replace(second=0, microsecond=0)
            t = t - timedelta(minutes=t.minute % 15)
            length = timedelta(minutes=15 * rng.randint(8, 4 * 36))  # 2 h to 36 h
            if t + length >= end:
                break
            booker = rng.choices(range(len(BOOKERS)), weights=[share for _, _, share in BOOKERS])[0]
            out.append((g, booker, t, t + length))
            t += length
    return out


def _hourly_rollups(gpu_id: int, start: datetime, end: datetime, profile: list[int], offset: int) -> list[Any]:
    """Hourly rollups over [start, end): the hour's mean of the profile's 57-second points, from `offset`."""
    from apps.telemetry.models import GpuHourlyRollup

    rows = []
    hour = start.replace(minute=0, second=0, microsecond=0)
    step_per_hour = 3600 / 57
    i = 0
    while hour < end:
        lo = int(offset + i * step_per_hour)
        points = [profile[(lo + k) % len(profile)] for k in range(int(step_per_hour))]
        mean = sum(points) / len(points)
        rows.append(
            GpuHourlyRollup(
                gpu_id=gpu_id,
                hour=hour,
                samples=3600,
                util_min=min(points),
                util_mean=round(mean, 2),
                util_max=max(points),
            )
        )
        hour += timedelta(hours=1)
        i += 1
    return rows


def _holds(plan: Sequence[tuple[int, int, Any, Any]], reservations: Sequence[Reservation], gpus: Sequence[Gpu]) -> None:
    """The quota holds the history's bookings would have left, at the price of their day, and the teams' monthly
    usage they count: what booking checks a new booking against, so the Book page's quota line and the Costs page's
    quota table agree with the history."""
    from apps.booking import quota as quota_math
    from apps.booking.models import QuotaHold
    from apps.booking.services.quotas import add_usage, hold_row

    timelines: dict[int, list[tuple[datetime, Decimal]]] = {}
    for price in Price.objects.filter(gpu_model__in={g.model_id for g in gpus}).order_by("valid_from"):
        timelines.setdefault(price.gpu_model_id, []).append((price.valid_from, price.hourly_price))
    tz = selectors.local_tz()
    holds: list[QuotaHold] = []
    usage: dict[int, dict[Any, quota_math.Amount]] = {}
    for (g, _, s, e), r in zip(plan, reservations, strict=True):
        model, part = gpus[g].model, gpus[g].capacity  # a part holds its fraction, at its fraction of the price
        gpu_rate = next((p for since, p in reversed(timelines.get(model.pk, [])) if since <= s), model.hourly_price)
        rate = gpu_rate * part
        kind = AllocationKind.RESERVATION
        holds.append(
            hold_row(
                team_id=r.team_id, kind=kind, gpu_count=1, gpus=part, hourly_rate=rate, start=s, end=e,
                reservation_id=r.pk,
            )
        )  # fmt: skip
        team = usage.setdefault(r.team_id, {})
        for month, amount in quota_math.hold_amounts(start=s, end=e, gpu_count=part, hourly_rate=rate, tz=tz).items():
            team[month] = team.get(month, quota_math.Amount()) + amount
    QuotaHold.objects.bulk_create(holds, batch_size=2000)
    for team_id, deltas in sorted(usage.items()):
        add_usage(team_id, deltas)


def _history(now: datetime) -> tuple[int, dict[int, Decimal]]:
    if Reservation.objects.filter(note=HISTORY_NOTE).exists():
        return 0, {}
    users = {u.username: u for u in get_user_model().objects.filter(username__in=[u for _, u, _ in BOOKERS])}
    teams = {t.slug: t for t in Team.objects.filter(slug__in=[t for t, _, _ in BOOKERS])}
    if len(users) < len(BOOKERS) or len(teams) < 2:
        logger.info("billing demo: the demo teams and users are missing; no history")
        return 0, {}
    gpus = _targets(_gpus())
    tz = selectors.local_tz()
    this_month = selectors.current_month(now=now)
    first = costing.month_bounds(costing.previous_month(costing.previous_month(this_month)), tz)[0]
    until = now - timedelta(hours=2)
    rng = random.Random(SEED)
    plan = _plan(gpus, first, until, rng)
    busy = {
        (gpu_id, s, e)
        for gpu_id, s, e in Allocation.objects.filter(active=True, start__lt=until, end__gt=first).values_list(
            "gpu_id", "start", "end"
        )
    }
    plan = [p for p in plan if not any(b[0] == gpus[p[0]].pk and b[1] < p[3] and b[2] > p[2] for b in busy)]
    reservations = Reservation.objects.bulk_create(
        [
            Reservation(
                team=teams[BOOKERS[b][0]],
                user=users[BOOKERS[b][1]],
                gpu_model=gpus[g].model,
                gpu_count=1,
                start=s,
                end=e,
                booked_end=e,
                status=ReservationStatus.RELEASED,
                note=HISTORY_NOTE,
                activated_at=s,
                ended_at=e,
            )
            for g, b, s, e in plan
        ]
    )
    # Booked a day or two before each starts, as people book (the column is auto_now_add: set after the insert).
    lead = {r.pk: timedelta(hours=rng.randint(2, 48)) for r in reservations}
    for r in reservations:
        r.created_at = r.start - lead[r.pk]
    Reservation.objects.bulk_update(reservations, ["created_at"], batch_size=2000)
    Allocation.objects.bulk_create(
        [
            Allocation(
                gpu=gpus[g],
                team=r.team,
                user=r.user,
                kind=AllocationKind.RESERVATION,
                reservation=r,
                start=s,
                end=e,
                ended_at=e,
            )
            for (g, _, s, e), r in zip(plan, reservations, strict=True)
        ]
    )
    _prices(sorted({g.model for g in gpus}, key=lambda m: m.name), first)
    _holds(plan, reservations, gpus)
    profiles = _profiles()
    rollups: list[Any] = []
    share_means: dict[int, Decimal] = {}
    for (g, _, s, e), r in zip(plan, reservations, strict=True):
        if rng.random() < NO_TELEMETRY_SHARE:
            continue
        profile = profiles[rng.randrange(len(profiles))]
        hours = _hourly_rollups(gpus[g].pk, s, e, profile, rng.randrange(len(profile)))
        if gpus[g].kind == DeviceKind.SHARE:
            # A share's utilization comes from its holder's processes' minute readings on the GPU, kept only days
            # and absent from the history: the ledger rows get the profile's mean instead (`_share_utilization`).
            share_means[r.pk] = Decimal(str(round(sum(h.util_mean for h in hours) / len(hours) / 100, 6)))
            continue
        rollups += hours
    from apps.telemetry.models import GpuHourlyRollup

    GpuHourlyRollup.objects.bulk_create(rollups, batch_size=2000, ignore_conflicts=True)
    return len(plan), share_means


def _share_utilization(means: dict[int, Decimal]) -> None:
    """The history's share bookings' ledger rows get their profile's mean utilization, as the closer would have
    read it from the holders' processes: the reports, the heatmap and the efficiency figures then show shares
    like whole GPUs rather than as GPU-hours without telemetry."""
    from apps.billing.models import SourceKind, UsageRecord

    rows = list(UsageRecord.objects.filter(source=SourceKind.RESERVATION, source_id__in=list(means),
                                           mean_utilization__isnull=True))  # fmt: skip
    for row in rows:
        row.mean_utilization = means[row.source_id]
    UsageRecord.objects.bulk_update(rows, ["mean_utilization"], batch_size=2000)


def load(*, now: datetime | None = None) -> None:
    now = now or timezone.now()
    with transaction.atomic():
        added, share_means = _history(now)
        # Every start, not only with the history: a model the agent registered since gets its price too.
        this_month = selectors.current_month(now=now)
        first = costing.month_bounds(costing.previous_month(costing.previous_month(this_month)), selectors.local_tz())
        _prices(list(GpuModel.objects.filter(gpus__retired_at__isnull=True).distinct().order_by("name")), first[0])
    # The closer and the month close, as the beat tasks would have run them.
    services.ledger_close(now=now)
    if share_means:
        _share_utilization(share_means)
    services.close_due_months(now=now)
    services.list_prices_sync(now=now)
    if added:
        logger.info("billing demo: %s bookings of history", added)
