"""Bookings whose devices a layout change or a vanished GPU took away: moved to an equal device, or ended.

Two things strand a booking. A layout change: the portal never repartitions, but admins do (mig-parted), and a
GPU's MIG instances come back with new uuids when they are made again (after a reboot, mig-parted creates them
anew); a reservation holding an instance that vanished, a whole GPU that has entered MIG mode (its instances are
booked now, not the GPU) or a share of such a GPU holds nothing usable. A gone GPU: one its node no longer reports
(pulled, or not found at the agent's start) or one its agent reports lost (fallen off the bus).

Each such booking is moved to devices that give the same, free for the rest of the booking, in the same pool and
of the same model, where a new booking could be placed (online node, no maintenance), the nearest first (the same
GPU, then the same node, then any): an instance of the same profile; for shares, as many shares of the same size
on one GPU split the same way; for a whole GPU (held exclusively, or through every share of a split GPU) an
exclusive GPU or every share of a split one. Allocations move together per unit (an instance, a GPU, the shares of
one GPU), so a half of a GPU never comes back as two quarters of two. Where a unit cannot move, the reservation is
cancelled (not started) or released (running) for the portal, as a release by its holder would be (the unused
quota given back, a `reservation.released` event for webhooks and mail), `released_reason` "layout" or
"gpu_gone". A gone GPU may come back (a reboot), so a booking of one that has not started is ended only when its
start comes and nothing could take it.

When: right after the registration (or the lost report) that changed things commits (`layout.py`'s guard: then
bookings that start later are looked at too), and on the lifecycle tick (what has started, and everything a layout
change stranded), which also catches a booking that was being written during the change.

Locks: the reservation's row (skipped when another writer holds it: the next tick looks again) and, for each
device tried, its booking lock taken without waiting (`pg_try_advisory_xact_lock`: a busy device is skipped, so
this takes no lock out of the package's order). The exclusion constraint stays the last guard. The same model,
profile and share size has the same price, and a whole GPU is one GPU however it is held, so the quota hold does
not change."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.audit.services import audit_record
from apps.booking import hooks
from apps.booking.models import Allocation, MaintenanceWindow, Reservation, ReservationStatus
from apps.booking.services.agents import send_holds
from apps.booking.services.conflicts import held_sql
from apps.booking.services.events import publish_reservation
from apps.booking.services.locks import GPU_LOCK_NAMESPACE
from apps.booking.services.reservations import reservation_release_by_portal
from apps.fleet.models import DeviceKind, Gpu, GpuStatus, NodeStatus

logger = logging.getLogger(__name__)

REASON = "layout"
REASON_GONE = "gpu_gone"

# Live reservation allocations on a device that holds nothing usable: a part its layout dropped, a whole GPU in MIG
# mode, a share of a GPU in MIG mode, or a device of a GPU that is gone (retired from its node, or lost): the last
# only once the allocation has started, unless `early` (right after the change). Driven from the devices (few) to
# their live allocations (the (gpu, end) index).
_STRANDED_SQL = """
SELECT DISTINCT a.reservation_id
FROM fleet_gpu d JOIN booking_allocation a ON a.gpu_id = d.id LEFT JOIN fleet_gpu p ON p.id = d.parent_id
WHERE a.active AND a.kind = 'reservation' AND a."end" > %(now)s {devices}
  AND ((p.id IS NOT NULL AND d.retired_at IS NOT NULL)
       OR (p.id IS NULL AND d.mig_mode)
       OR (d.kind = 'share' AND p.mig_mode)
       OR ((a.start <= %(now)s OR %(early)s)
           AND CASE WHEN p.id IS NULL THEN d.retired_at IS NOT NULL OR d.status = %(lost)s
                    ELSE p.retired_at IS NOT NULL OR p.status = %(lost)s END))
ORDER BY a.reservation_id
LIMIT %(limit)s
"""


def stranded_reservations(
    *, now: datetime, device_ids: list[int] | None = None, early: bool = False, limit: int = 200
) -> list[int]:
    """Reservations with a live allocation on a device that holds nothing usable (optionally only on these devices
    or their parts; `early`: a gone GPU's bookings that have not started too)."""
    devices = "AND (d.id = ANY(%(ids)s) OR d.parent_id = ANY(%(ids)s))" if device_ids is not None else ""
    params = {"now": now, "ids": device_ids, "early": early, "lost": GpuStatus.LOST.value, "limit": limit}
    with connection.cursor() as cursor:
        cursor.execute(_STRANDED_SQL.format(devices=devices), params)
        return [int(r[0]) for r in cursor.fetchall()]


@dataclass(frozen=True)
class Outcome:
    reservation_id: int
    moved: dict[str, str]  # old device uuid -> new device uuid (the GPU's, where a whole GPU is held another way)
    ended: bool


def _whole(gpu: Gpu) -> Gpu:
    return gpu.parent if gpu.parent_id is not None and gpu.parent else gpu


def trouble(gpu: Gpu) -> str | None:
    """Why a device holds nothing usable ("gpu_gone" or "layout"), or None: the Python twin of the SQL above."""
    whole = _whole(gpu)
    if whole.retired_at is not None or whole.status == GpuStatus.LOST:
        return REASON_GONE
    if gpu.parent_id is None:
        return REASON if gpu.mig_mode else None
    if gpu.retired_at is not None or (gpu.kind == DeviceKind.SHARE and whole.mig_mode):
        return REASON
    return None


@dataclass
class _Unit:
    """Allocations that move together: one device's, or those of the shares of one GPU."""

    allocations: list[Allocation]
    reason: str

    @property
    def first(self) -> Gpu:
        return self.allocations[0].gpu

    @property
    def whole(self) -> bool:
        """It gives a whole GPU: an exclusive one, or every share of a split one."""
        if self.first.parent_id is None:
            return True
        return self.first.kind == DeviceKind.SHARE and sum((a.gpu.capacity for a in self.allocations), Decimal(0)) == 1

    def start(self, now: datetime) -> datetime:
        return max(min(a.start for a in self.allocations), now)

    def end(self) -> datetime:
        return max(a.end for a in self.allocations)

    def started(self, now: datetime) -> bool:
        return min(a.start for a in self.allocations) <= now

    def what(self) -> str:
        model = _whole(self.first).model.name
        if self.whole:
            return f"a whole GPU ({model})"
        if self.first.kind == DeviceKind.MIG:
            return f"a {self.first.mig_profile} instance ({model})"
        share = sum((a.gpu.capacity for a in self.allocations), Decimal(0))
        return f"{share.normalize():f} of a GPU ({model})"


def _units(stuck: list[tuple[Allocation, str]]) -> list[_Unit]:
    """A reservation's stranded allocations in units; the shares of one GPU are one unit."""
    units: dict[tuple[str, int], _Unit] = {}
    for allocation, reason in stuck:
        gpu = allocation.gpu
        key = ("shares", gpu.parent_id) if gpu.kind == DeviceKind.SHARE and gpu.parent_id else ("device", gpu.pk)
        unit = units.setdefault(key, _Unit([], reason))
        unit.allocations.append(allocation)
        if reason == REASON_GONE:
            unit.reason = REASON_GONE
    for unit in units.values():
        unit.allocations.sort(key=lambda a: (a.gpu.index, a.gpu_id))
    return list(units.values())


def _usable(qs: QuerySet[Gpu], old: Gpu, window: tuple[datetime, datetime], *, part: bool) -> QuerySet[Gpu]:
    """Live, healthy devices of online nodes in the old one's pool, with no maintenance of their GPU or node in the
    window, as a new booking would find them. Another pool's GPUs are another scheduler's (a Slurm pool mirrors
    its own bookings). A fleet-wide maintenance window is left out: it covers the old device as much as any."""
    pool = _whole(old).node.pool_id
    prefix = "parent__" if part else ""
    same_pool = Q(**{f"{prefix}node__pool__isnull": True}) if pool is None else Q(**{f"{prefix}node__pool_id": pool})
    qs = qs.filter(same_pool, retired_at__isnull=True, status=GpuStatus.OK, node__status=NodeStatus.ONLINE)
    if part:
        qs = qs.filter(parent__retired_at__isnull=True, parent__status=GpuStatus.OK)
    start, end = window
    down = MaintenanceWindow.objects.filter(start__lt=end, end__gt=start)
    return qs.exclude(**{f"{prefix}pk__in": down.filter(gpu__isnull=False).values("gpu_id")}).exclude(
        node_id__in=down.filter(node__isnull=False).values("node_id")
    )


def _targets(
    unit: _Unit, taken: set[int], free: Callable[[Gpu], bool], window: tuple[datetime, datetime]
) -> Iterator[list[Gpu]]:
    """The device sets that give what `unit` gave, the nearest first (the same GPU, then the same node), each
    device free by `free` (shares are picked among the free ones of a GPU)."""
    old = unit.first
    whole_old = _whole(old)
    model_id = whole_old.model_id
    options: list[tuple[tuple[int, int, int, int], Callable[[], list[Gpu] | None]]] = []

    def near(gpu: Gpu, rank: int) -> tuple[int, int, int, int]:
        return (0 if gpu.pk == whole_old.pk else 1, 0 if gpu.node_id == whole_old.node_id else 1, rank, gpu.pk)

    def one(device: Gpu) -> Callable[[], list[Gpu] | None]:
        return lambda: [device] if free(device) else None

    def every(shares: list[Gpu]) -> Callable[[], list[Gpu] | None]:
        return lambda: shares if all(free(s) for s in shares) else None

    def some(shares: list[Gpu], wanted: list[Decimal]) -> Callable[[], list[Gpu] | None]:
        return lambda: _pick([s for s in shares if s.capacity in wanted and free(s)], wanted)

    if unit.whole:
        exclusive = _usable(Gpu.objects.filter(model_id=model_id, mig_mode=False, shares=1), old, window, part=False)
        options += [(near(g, 0), one(g)) for g in exclusive.exclude(pk__in=taken)]
        split = _usable(Gpu.objects.filter(model_id=model_id, mig_mode=False, shares__gt=1), old, window, part=False)
        for gpu, shares in _shares_by_gpu(split.exclude(pk=whole_old.pk), taken).items():
            if len(shares) == gpu.shares:
                options.append((near(gpu, 1), every(shares)))
    elif old.kind == DeviceKind.MIG:
        mig = Gpu.devices.filter(kind=DeviceKind.MIG, mig_profile=old.mig_profile, parent__mig_mode=True)
        found = _usable(mig.filter(parent__model_id=model_id), old, window, part=True).exclude(pk__in=taken)
        options += [(near(g.parent, 0), one(g)) for g in found.select_related("parent") if g.parent]
    else:  # shares: as many of the same sizes on one GPU split the same way
        split = Gpu.objects.filter(model_id=model_id, mig_mode=False, shares=whole_old.shares)
        wanted = [a.gpu.capacity for a in unit.allocations]
        for gpu, shares in _shares_by_gpu(_usable(split, old, window, part=False), taken).items():
            options.append((near(gpu, 0), some(shares, wanted)))
    for _, devices in sorted(options, key=lambda o: o[0]):
        found_devices = devices()
        if found_devices is not None:
            yield found_devices


def _shares_by_gpu(gpus: QuerySet[Gpu], taken: set[int]) -> dict[Gpu, list[Gpu]]:
    """Each GPU's live shares not in `taken`, in index order."""
    parents = {g.pk: g for g in gpus}
    shares = Gpu.devices.filter(parent_id__in=parents, kind=DeviceKind.SHARE, retired_at__isnull=True)
    out: dict[Gpu, list[Gpu]] = {}
    for share in shares.exclude(pk__in=taken).order_by("parent_id", "index"):
        assert share.parent_id is not None
        share.parent = parents[share.parent_id]
        out.setdefault(share.parent, []).append(share)
    return out


def _pick(shares: list[Gpu], wanted: list[Decimal]) -> list[Gpu] | None:
    """One share per wanted capacity, in the order wanted (so the quota hold stays the same to the millionth)."""
    left = list(shares)
    picked: list[Gpu] = []
    for capacity in wanted:
        match = next((s for s in left if s.capacity == capacity), None)
        if match is None:
            return None
        left.remove(match)
        picked.append(match)
    return picked


def _free(gpu_ids: list[int], start: datetime, end: datetime) -> bool:
    """Take each device's booking lock without waiting, then whether nothing holds any of them in [start, end)."""
    held = held_sql(gpu="%(gpu)s", start="%(start)s", end="%(end)s")
    # Only this package's SQL is formatted in; every value is a parameter.
    sql = f"SELECT pg_try_advisory_xact_lock(%(ns)s, %(gpu)s::int) AND NOT {held}"
    with connection.cursor() as cursor:
        for gpu_id in gpu_ids:
            cursor.execute(sql, {"ns": GPU_LOCK_NAMESPACE, "gpu": gpu_id, "start": start, "end": end})
            row = cursor.fetchone()
            if not (row and row[0]):
                return False
    return True


def _free_in(start: datetime, end: datetime) -> Callable[[Gpu], bool]:
    return lambda gpu: _free([gpu.pk], start, end)


def _parents_free(devices: list[Gpu], unit: _Unit, now: datetime) -> bool:
    # A part is free only when its GPU is not held whole (by a row of the GPU itself) either.
    return _free(sorted({d.parent_id for d in devices if d.parent_id is not None}), unit.start(now), unit.end())


def _move(unit: _Unit, to: list[Gpu], now: datetime) -> bool:
    """The unit's allocations, from `now` on, on `to` instead; False (nothing changed) if the constraint refuses."""
    try:
        with transaction.atomic():
            if len(to) == len(unit.allocations):
                for allocation, gpu in zip(unit.allocations, to, strict=True):
                    _move_one(allocation, gpu, now)
            else:  # a whole GPU held another way (one exclusive GPU <-> every share of a split one)
                for allocation in unit.allocations:
                    _cut(allocation, now)
                template = unit.allocations[0]
                for gpu in to:
                    _copy(template, gpu, unit.start(now), unit.end())
    except IntegrityError:
        return False
    return True


def _move_one(allocation: Allocation, to: Gpu, now: datetime) -> None:
    if allocation.start >= now:
        Allocation.objects.filter(pk=allocation.pk).update(gpu=to)
    else:  # the part already used stays on the old device, for the record and the bill
        _cut(allocation, now)
        _copy(allocation, to, now, allocation.end)


def _cut(allocation: Allocation, now: datetime) -> None:
    if allocation.start >= now:  # not started: it leaves the constraint and the bill
        Allocation.objects.filter(pk=allocation.pk).update(active=False, ended_at=now)
    else:
        Allocation.objects.filter(pk=allocation.pk).update(end=now, ended_at=now)


def _copy(allocation: Allocation, to: Gpu, start: datetime, end: datetime) -> None:
    Allocation.objects.create(
        gpu=to,
        team_id=allocation.team_id,
        user_id=allocation.user_id,
        kind=allocation.kind,
        reservation_id=allocation.reservation_id,
        start=start,
        end=end,
    )


def _said(units: list[_Unit], *, ended: bool) -> str:
    held = ", ".join(sorted({u.what() for u in units}))
    gone = any(u.reason == REASON_GONE for u in units)
    if gone:
        cause = "The GPU it held is gone from its node (removed, or fallen off the bus)"
    else:
        cause = "The MIG layout of the GPU it held changed (its admin repartitioned it)"
    if not ended:
        return f"{cause}; it holds {held} again, on another device."
    book = "another GPU" if gone else "one of the GPU's new instances or another GPU"
    return f"{cause}, and no free device gives {held} for the rest of this booking; book again to get {book}."


def _waits(unit: _Unit, now: datetime) -> bool:
    """A unit of a gone GPU that has not started waits for a device (the GPU may come back, after a reboot) instead
    of ending the booking."""
    return unit.reason == REASON_GONE and not unit.started(now)


def _moves(unit: _Unit, target: list[Gpu]) -> dict[str, str]:
    """Old device uuid -> new one; where a whole GPU changes how it is held, the GPU's uuid."""
    if len(target) == len(unit.allocations):
        return {a.gpu.uuid: g.uuid for a, g in zip(unit.allocations, target, strict=True)}
    new = _whole(target[0]).uuid
    return {a.gpu.uuid: new for a in unit.allocations}


def reservation_rehome(*, reservation_id: int, now: datetime | None = None) -> Outcome | None:
    """Move a reservation's stranded allocations, or end it (see the module docstring). None when nothing changed:
    it has none, its row is busy (the next tick looks again), or only a gone GPU's booking that has not started
    found no device yet."""
    now = now or timezone.now()
    with transaction.atomic():
        reservation = (
            Reservation.objects.select_for_update(skip_locked=True)
            .filter(pk=reservation_id, status__in=[ReservationStatus.BOOKED, ReservationStatus.ACTIVE], end__gt=now)
            .first()
        )
        if reservation is None:
            return None
        live = list(
            Allocation.objects.filter(reservation=reservation, active=True, end__gt=now).select_related(
                "gpu__model", "gpu__node", "gpu__parent__model", "gpu__parent__node"
            )
        )
        stuck = [(a, why) for a in live if (why := trouble(a.gpu)) is not None]
        if not stuck:
            return None
        units = _units(stuck)
        taken = {a.gpu_id for a in live}
        moved: dict[str, str] = {}
        done: list[_Unit] = []
        fatal = False
        with transaction.atomic():  # every stuck unit moves, or none does (but see `waits`)
            for unit in units:
                window = (unit.start(now), unit.end())
                options = _targets(unit, taken, _free_in(*window), window)
                # The next option when the constraint refuses one (a writer the advisory locks did not stop).
                target = next((t for t in options if _parents_free(t, unit, now) and _move(unit, t, now)), None)
                if target is not None:
                    taken.update(g.pk for g in target)
                    moved.update(_moves(unit, target))
                    done.append(unit)
                elif not _waits(unit, now):
                    fatal = True
                    transaction.set_rollback(True)
                    break
        if not fatal:
            if not done:
                return None  # only gone GPUs' bookings that have not started: looked at again later
            reason = REASON_GONE if any(u.reason == REASON_GONE for u in done) else REASON
            Reservation.objects.filter(pk=reservation.pk).update(changed_at=now)  # calendars fetch it again
            audit_record(
                actor=None, action="reservation.move", target=reservation, data={"moves": moved, "reason": reason}
            )
            if reservation.status == ReservationStatus.ACTIVE:
                send_holds(reservation.pk)
            said = _said(done, ended=False)
            # Integrations that hold a device's uuid (a CI job pinned to it) learn where the booking is now.
            publish_reservation(
                "reservation.moved", reservation, status=reservation.status, reason=reason, moves=moved, message=said
            )
            _tell(reservation, ended=False, reason=reason, message=said, moved=moved)
            return Outcome(reservation_id=reservation.pk, moved=moved, ended=False)
    # Nothing free gives it: end it in a transaction of its own, in the order a release by its holder takes locks.
    reason = REASON_GONE if any(u.reason == REASON_GONE for u in units) else REASON
    message = _said(units, ended=True)
    with transaction.atomic():
        ended = reservation_release_by_portal(
            reservation_id=reservation_id,
            reason=reason,
            data={"devices": [a.gpu.uuid for a, _ in stuck]},
            now=now,
            cancel_unstarted=True,
            message=message,
        )
        if ended is not None:
            _tell(ended, ended=True, reason=reason, message=message)
    return None if ended is None else Outcome(reservation_id=reservation_id, moved={}, ended=True)


def _tell(
    reservation: Reservation, *, ended: bool, reason: str, message: str, moved: dict[str, str] | None = None
) -> None:
    """The reservation-rehomed hooks, after commit (the efficiency app tells the holder's open pages)."""
    event = hooks.ReservationRehomed(
        reservation_id=reservation.pk,
        team_id=reservation.team_id,
        user_id=reservation.user_id,
        ended=ended,
        reason=reason,
        message=message,
        moved=dict(moved or {}),
    )
    transaction.on_commit(lambda: hooks.on_reservation_rehomed(event))


def reservations_rehome_stranded(
    *, now: datetime | None = None, device_ids: list[int] | None = None
) -> dict[str, list[int]]:
    """`reservation_rehome` for every stranded reservation; what moved and what ended. With `device_ids` (right
    after a change, for those devices and their parts) a gone GPU's bookings that start later are tried too."""
    now = now or timezone.now()
    out: dict[str, list[int]] = {"moved": [], "ended": []}
    for rid in stranded_reservations(now=now, device_ids=device_ids, early=device_ids is not None):
        outcome = reservation_rehome(reservation_id=rid, now=now)
        if outcome is not None:
            out["ended" if outcome.ended else "moved"].append(rid)
    if out["moved"] or out["ended"]:
        logger.info("stranded bookings: moved %s, ended %s", out["moved"], out["ended"])
    return out
