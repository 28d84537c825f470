"""The transaction-scoped advisory locks of booking (PostgreSQL `pg_advisory_xact_lock(namespace, id)`).

They are held until the transaction ends, and always taken in the order the package docstring gives, so two
writers never deadlock."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

GPU_LOCK_NAMESPACE = 0x4750  # "GP": the first key of pg_advisory_xact_lock(int, int) for GPU locks
MODEL_LOCK_NAMESPACE = 0x474D  # "GM": placement by GPU model


def lock_gpus(gpu_ids: Iterable[int]) -> None:
    """Per-GPU transaction locks in ascending id order.

    Taking them before the overlap check makes concurrent bookings of one GPU queue up instead of deadlocking
    inside the exclusion check (SQLSTATE 40P01, which PostgreSQL only detects after deadlock_timeout)."""
    ids = sorted(set(gpu_ids))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, g) FROM unnest(%s::int[]) AS g", [GPU_LOCK_NAMESPACE, ids])


def lock_model(model_id: int) -> None:
    """Serialize placement per GPU model: concurrent bookings by model would otherwise all pick the same best-fit
    GPUs and all but one lose them. Taken before the quota rows and the GPU locks."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MODEL_LOCK_NAMESPACE, model_id])
