"""Efficiency fixtures: the booking fleet (node "big" with 8 A100, "small" with 4 A100 + 2 H100) and minute
rollups written as the telemetry flush writes them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from apps.booking import selectors as booking_selectors
from apps.telemetry.models import GpuRollup
from tests.booking.conftest import a100, fleet, h100  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def _fresh_policy() -> None:
    booking_selectors.policy_cache_clear()


def write_minutes(gpu: Any, start: datetime, minutes: int, *, util: float, mem: int) -> None:
    """One GpuRollup per minute from `start` (60 samples each, as a full minute of 1 Hz telemetry)."""
    GpuRollup.objects.bulk_create(
        [
            GpuRollup(
                gpu=gpu,
                minute=start + timedelta(minutes=i),
                samples=60,
                util_min=int(util),
                util_mean=util,
                util_max=int(util),
                mem_used_mean=mem,
                mem_used_max=mem,
            )
            for i in range(minutes)
        ],
        update_conflicts=True,
        unique_fields=["gpu", "minute"],
        update_fields=["util_mean", "mem_used_max", "mem_used_mean", "util_min", "util_max"],
    )
