"""Shares' capacities that add up to exactly 1: 1/N to 6 places with the rounding remainder on the first shares
(`apps.fleet.devices.share_capacity`), for GPUs split before. A GPU split in 3 had 3 x 0.333333, so a holder of
all three was billed and counted 0.999999 of a GPU. Only live shares change; the ledger keeps what it wrote."""

from decimal import ROUND_DOWN, Decimal

from django.db import migrations

_PLACES = Decimal("0.000001")


def _capacity(shares: int, index: int) -> Decimal:
    # A copy of share_capacity as of this migration: migrations do not import app code that may change.
    base = (Decimal(1) / shares).quantize(_PLACES, ROUND_DOWN)
    left = int((1 - base * shares) / _PLACES)
    return base + _PLACES if index < left else base


def exact_capacities(apps, schema_editor):  # type: ignore[no-untyped-def]
    gpu = apps.get_model("fleet", "Gpu")
    parts = gpu._base_manager.filter(kind="share", retired_at__isnull=True).select_related("parent")
    for part in parts:
        if part.parent is None or part.parent.shares < 2:
            continue
        capacity = _capacity(part.parent.shares, part.index)
        if part.capacity != capacity:
            gpu._base_manager.filter(pk=part.pk).update(capacity=capacity)


class Migration(migrations.Migration):
    dependencies = [("fleet", "0004_gpu_devices")]

    operations = [migrations.RunPython(exact_capacities, migrations.RunPython.noop)]
