"""Hooks the apps above the fleet plug into; the fleet calls them and never imports those apps.

A node's registration can change a GPU's MIG layout (an admin repartitioned it with mig-parted, or the instances
came back with new uuids after a reboot). Bookings and the scheduler hold the devices of the old layout, so a
layout guard is told, inside the registration's transaction:

- `lock()`, first thing, before the node's and GPUs' row locks, when the report's MIG layout differs from the one
  recorded (a periodic registration that changes nothing takes no lock):
  the guard takes the locks that order the change against the scheduler's writes (booking registers one that
  takes `jobs.SchedulerState`'s row, as an admin's change of shares does), so the lock order stays the same;
- `changed(change)`, once the new layout is written, when it changed: the guard marks the old layout stale and
  arranges for the bookings the change stranded to be moved or released after commit. A GPU the node no longer
  reports is part of the change (`gone`), and the registration takes the guard's locks for it too.
- `lost(gpu_ids)`, after the commit that marked GPUs lost (their agent reports them fallen off the bus): the guard
  moves or ends their bookings as for a gone GPU. No lock is held then.

Default: no guard, nothing happens (the fleet works alone). Guards must not swallow database errors: the
registration's transaction is theirs too.

    from apps.fleet.hooks import LayoutChange, register_layout_guard
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LayoutChange:
    """What a registration changed: `retired` parts (instances that vanished or moved slot), `into_mig` GPUs
    (whole GPUs that entered MIG mode, so they are no longer booked whole) and `gone` GPUs (no longer reported by
    their node: retired, and lost until they come back)."""

    node_id: int
    retired: tuple[int, ...]
    into_mig: tuple[int, ...]
    gone: tuple[int, ...] = ()


def _nothing(gpu_ids: tuple[int, ...]) -> None:
    return None


@dataclass(frozen=True)
class LayoutGuard:
    lock: Callable[[], None]
    changed: Callable[[LayoutChange], None]
    lost: Callable[[tuple[int, ...]], None] = _nothing


_guards: list[LayoutGuard] = []


def register_layout_guard(guard: LayoutGuard) -> LayoutGuard:
    """Register a guard; registering an equal one twice is a no-op."""
    if guard not in _guards:
        _guards.append(guard)
    return guard


def unregister_layout_guard(guard: LayoutGuard) -> None:
    if guard in _guards:
        _guards.remove(guard)


def layout_lock() -> None:
    for guard in list(_guards):
        guard.lock()


def layout_changed(change: LayoutChange) -> None:
    for guard in list(_guards):
        guard.changed(change)


def gpus_lost(gpu_ids: tuple[int, ...]) -> None:
    for guard in list(_guards):
        guard.lost(gpu_ids)
