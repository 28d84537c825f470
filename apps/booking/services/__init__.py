"""Writes for booking: GPU allocations, quota holds, reservations and their lifecycle, calendar feeds.

One module per concern; callers use the names re-exported here (`services.reservation_create(...)`), modules of
the package import each other directly.

Locks, always taken in this order so two writers cannot deadlock:
0. (placement by model only) the model's placement lock, `pg_advisory_xact_lock(MODEL_LOCK_NAMESPACE, model_id)`;
1. the team's `QuotaUsage` rows of the months involved (`SELECT ... FOR UPDATE`, by month and slot);
2. the GPUs, by `pg_advisory_xact_lock(GPU_LOCK_NAMESPACE, gpu_id)` in ascending id order.
A change of how a GPU is split (`layout.py`) takes the scheduler's row (`jobs.SchedulerState`, which the scheduler's
write transaction takes first too) before 0 and 2, and no quota rows; a node's registration that may change a MIG
layout or drop a GPU takes that row before its node's and GPUs' rows. Moving a booking a layout change or a gone
GPU stranded (`stranded.py`) takes its reservation's row without waiting and each GPU it tries with
`pg_try_advisory_xact_lock`, so it waits for no lock out of this order. Ending a reservation or moving its end
(`reschedule.py`) takes its reservation's row before 1 and 2; nothing that holds 1 or 2 waits for that row.
The exclusion constraint on `booking_allocation` is the last guard.
"""

from apps.booking.services.allocations import (
    AllocationRequest,
    allocation_end,
    allocations_create,
    allocations_create_many,
    allocations_end_of_job,
)
from apps.booking.services.calendar import calendar_feed_regenerate
from apps.booking.services.conflicts import MAX_CONFLICTS_SHOWN, Slot, describe_slots
from apps.booking.services.layout import gpu_shares_change
from apps.booking.services.locks import GPU_LOCK_NAMESPACE, MODEL_LOCK_NAMESPACE
from apps.booking.services.quotas import (
    QuotaCheck,
    quota_check_and_hold,
    quota_concurrency_check,
    quota_gpus,
    quota_hold_release,
    quota_hold_update,
    quota_models_check,
)
from apps.booking.services.reschedule import EndChanged, reservation_change_end
from apps.booking.services.reservations import (
    BookingResult,
    check_window,
    reservation_create,
    reservation_end,
    reservations_tick,
)
from apps.booking.services.stranded import reservation_rehome, reservations_rehome_stranded

__all__ = [
    "GPU_LOCK_NAMESPACE",
    "MAX_CONFLICTS_SHOWN",
    "MODEL_LOCK_NAMESPACE",
    "AllocationRequest",
    "BookingResult",
    "EndChanged",
    "QuotaCheck",
    "Slot",
    "allocation_end",
    "allocations_create",
    "allocations_create_many",
    "allocations_end_of_job",
    "calendar_feed_regenerate",
    "check_window",
    "describe_slots",
    "gpu_shares_change",
    "quota_check_and_hold",
    "quota_concurrency_check",
    "quota_gpus",
    "quota_hold_release",
    "quota_hold_update",
    "quota_models_check",
    "reservation_change_end",
    "reservation_create",
    "reservation_end",
    "reservation_rehome",
    "reservations_rehome_stranded",
    "reservations_tick",
]
