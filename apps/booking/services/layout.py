"""An admin's change of how a GPU is split in shares, under booking's locks.

`apps.fleet.devices.gpu_set_shares` refuses the change while the GPU or a share of it is held now or later. For
that check to see every booking, it runs here under the locks bookings take (the package docstring's order): the
GPU model's placement lock, which every booking of a part and every booking by model takes before it reads the
layout, then the GPU's and its parts' locks, which every writer of an allocation of them holds until it commits.
So a booking either commits first (and the change is refused, 409) or reads the new layout after the change.

The scheduler places whole-GPU jobs from a snapshot read before its write transaction, so the change also bumps
`jobs.SchedulerState.layout_version`, first (the scheduler's write takes that row before the model's lock, and
this takes them in the same order): a pass that read the old layout starts nothing, and one writing now finishes
first, so the check below sees its jobs."""

from __future__ import annotations

from django.apps import apps as django_apps
from django.db import transaction
from django.db.models import F

from apps.accounts.types import AnyUser
from apps.booking.services.locks import lock_gpus, lock_model
from apps.core.errors import NotFound
from apps.fleet.devices import gpu_set_shares
from apps.fleet.hooks import LayoutChange, LayoutGuard
from apps.fleet.models import Gpu


def _scheduler_row_lock() -> None:
    # Read by name: jobs sits above booking in the import graph.
    state = django_apps.get_model("jobs", "SchedulerState")
    state.objects.get_or_create(pk=1)
    state.objects.select_for_update().filter(pk=1).values_list("pk", flat=True).first()


def _registration_changed(change: LayoutChange) -> None:
    from apps.booking.services.stranded import reservations_rehome_stranded

    _bump_layout_version()
    devices = [*change.retired, *change.into_mig, *change.gone]
    # robust: a failure here is logged, not raised into the registration (the lifecycle tick tries again).
    transaction.on_commit(lambda: reservations_rehome_stranded(device_ids=devices), robust=True)


def _gpus_lost(gpu_ids: tuple[int, ...]) -> None:
    from apps.booking.services.stranded import reservations_rehome_stranded

    reservations_rehome_stranded(device_ids=list(gpu_ids))


LAYOUT_GUARD = LayoutGuard(lock=_scheduler_row_lock, changed=_registration_changed, lost=_gpus_lost)


def _bump_layout_version() -> None:
    # Read by name: jobs sits above booking in the import graph.
    state = django_apps.get_model("jobs", "SchedulerState")
    state.objects.get_or_create(pk=1)
    state.objects.filter(pk=1).update(layout_version=F("layout_version") + 1)


def gpu_shares_change(*, actor: AnyUser | None, gpu_uuid: str, shares: int) -> tuple[Gpu, list[Gpu]]:
    """Split the GPU in `shares` equal shares (1: exclusive again); returns it and its live shares. 404 for a GPU
    that does not exist (or names a part); 400 and 409 as `gpu_set_shares`."""
    found = Gpu.objects.filter(uuid=gpu_uuid, retired_at__isnull=True).values_list("pk", "model_id").first()
    if found is None:
        raise NotFound(f"No GPU {gpu_uuid!r}.")
    gpu_id, model_id = found
    with transaction.atomic():
        _bump_layout_version()
        lock_model(model_id)
        lock_gpus([gpu_id, *Gpu.devices.filter(parent_id=gpu_id).values_list("pk", flat=True)])
        gpu = gpu_set_shares(actor=actor, gpu_uuid=gpu_uuid, shares=shares)
        live = list(Gpu.devices.filter(parent=gpu, kind="share", retired_at__isnull=True).order_by("index"))
    return gpu, live
