"""`devices_series`: what a reservation's devices did over its window, for its page's chart. A whole GPU brings its
utilization and memory, a MIG instance its own memory and its GPU's utilization, a share its GPU's utilization only;
a window over 12 hours is read per hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.fleet.devices import MigInstance, gpu_set_shares, mig_layout_apply
from apps.fleet.models import DeviceKind, Gpu
from apps.telemetry.models import GpuHourlyRollup, GpuRollup
from apps.telemetry.selectors import devices_series
from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db

T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)


def _minute(gpu: Gpu, at: datetime, util: float | None, mem: int | None) -> None:
    GpuRollup.objects.create(gpu=gpu, minute=at, samples=60, util_mean=util, mem_used_max=mem)


def test_each_kind_of_device_brings_what_is_its_own():
    whole = GpuFactory(uuid="GPU-w")
    mig = GpuFactory(uuid="GPU-m", mig_mode=True)
    mig_layout_apply(gpu=mig, mig_mode=True, instances=[MigInstance("MIG-m-1", "1g.10gb", 9_728, 7)])
    instance = Gpu.devices.get(uuid="MIG-m-1")
    split = GpuFactory(uuid="GPU-s")
    gpu_set_shares(actor=None, gpu_uuid="GPU-s", shares=4)
    share = Gpu.devices.filter(parent=split, kind=DeviceKind.SHARE).first()
    assert share is not None
    _minute(whole, T0, 80.0, 40_000)
    _minute(mig, T0, 20.0, 70_000)  # the whole GPU's memory: every instance's
    _minute(instance, T0, None, 3_000)
    _minute(split, T0, 50.0, 60_000)  # every share's memory together
    _minute(whole, T0 + timedelta(minutes=1), 60.0, 1_000)

    points = devices_series(devices=[whole, instance, share], start=T0, end=T0 + timedelta(minutes=5))
    assert points == [
        {"t": T0.isoformat(), "util": 50.0, "mem": 40_000},  # (80 + 20 + 50) / 3; the instance's 3,000 < 40,000
        {"t": (T0 + timedelta(minutes=1)).isoformat(), "util": 60.0, "mem": 1_000},
    ]
    assert devices_series(devices=[instance], start=T0, end=T0 + timedelta(minutes=5))[0] == {
        "t": T0.isoformat(), "util": 20.0, "mem": 3_000,
    }  # fmt: skip
    assert devices_series(devices=[share], start=T0, end=T0 + timedelta(minutes=5))[0]["mem"] is None


def test_a_long_window_is_read_per_hour():
    gpu = GpuFactory(uuid="GPU-long")
    hour = T0.replace(minute=0)
    GpuHourlyRollup.objects.create(gpu=gpu, hour=hour - timedelta(hours=13), samples=3600, util_mean=10.0,
                                   mem_used_max=500)  # fmt: skip
    GpuHourlyRollup.objects.create(gpu=gpu, hour=hour, samples=3600, util_mean=30.0, mem_used_max=900)
    _minute(gpu, T0, 99.0, 99)  # a minute row is not read for a long window
    points = devices_series(devices=[gpu], start=hour - timedelta(hours=13), end=T0 + timedelta(minutes=1))
    assert [(p["util"], p["mem"]) for p in points] == [(10.0, 500), (30.0, 900)]
