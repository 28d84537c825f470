"""Rollups: closed minutes become GpuRollup rows exactly once in effect; hours are recomputed from minutes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.core.redis import get_redis
from apps.telemetry import keys
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.models import GpuHourlyRollup, GpuRollup
from apps.telemetry.rollups import accumulator_to_rows, flush_rollups, prune, rollup_hour
from tests.fleet.util import registered_node, row, telemetry

pytestmark = pytest.mark.django_db


def _feed_minute(token: str, minute: int, utils: list[int]) -> None:
    for i, util in enumerate(utils):
        ts = minute + i
        telemetry_ingest(
            telemetry(
                "n1", token, [row("GPU-n1-0", util=util, mem=1000 + i, temp=50 + util // 10, power=100.0 + i)], ts=ts
            ),
            now=ts + 1,
        )


def test_accumulator_fields_become_figures() -> None:
    raw = {
        b"G|n": b"3",
        b"G|u_n": b"3",
        b"G|u_s": b"130",
        b"G|u_lo": b"10",
        b"G|u_hi": b"90",
        b"G|m_n": b"2",
        b"G|m_s": b"3000",
        b"G|m_hi": b"2000",
        b"G|t_n": b"3",
        b"G|t_hi": b"70",
        b"G|p_n": b"3",
        b"G|p_s": b"301.5",
    }
    assert accumulator_to_rows(raw) == {
        "G": {
            "samples": 3,
            "util_min": 10,
            "util_mean": 43.333,
            "util_max": 90,
            "mem_used_mean": 1500.0,
            "mem_used_max": 2000,
            "temp_max": 70,
            "power_mean": 100.5,
        }
    }


def test_a_closed_minute_is_flushed_and_an_open_one_is_not(settings) -> None:
    _, token = registered_node("n1", ("A100-80GB",))
    minute = int(time.time() // 60 * 60) - 120
    _feed_minute(token, minute, [10, 20, 90])
    assert flush_rollups(now=minute + 60) == 0  # still open: a late sample could land in it
    written = flush_rollups(now=minute + 60 + settings.TELEMETRY_MAX_AGE_S + 6)
    assert written == 1
    r = GpuRollup.objects.get()
    assert r.minute == datetime.fromtimestamp(minute, tz=UTC)
    assert (r.samples, r.util_min, r.util_max, r.util_mean) == (3, 10, 90, 40.0)
    assert (r.mem_used_mean, r.mem_used_max, r.temp_max, r.power_mean) == (1001.0, 1002, 59, 101.0)
    assert not get_redis().exists(keys.rollup_key(minute))
    assert get_redis().zscore(keys.ROLLUP_PENDING, minute) is None


def test_minutes_flushed_hours_late_are_rolled_up_into_their_hour() -> None:
    """The worker was down for three hours while the accumulators waited in Redis: the late flush rolls their hour
    up itself (`rollup_hours` only looks at the current and the previous hour), so the prune does not later delete
    minutes that no hourly row holds."""
    _, token = registered_node("n1", ("A100-80GB",))
    minute = int(time.time() // 60 * 60) - 180
    _feed_minute(token, minute, [30, 50])
    assert flush_rollups(now=minute + 3 * 3600) == 1
    (hour,) = GpuHourlyRollup.objects.all()
    assert hour.hour == datetime.fromtimestamp(minute, tz=UTC).replace(minute=0)
    assert (hour.samples, hour.util_mean) == (2, 40.0)
    # On time, the flush leaves the hours to `rollup_hours`.
    GpuHourlyRollup.objects.all().delete()
    _feed_minute(token, minute + 60, [10])
    assert flush_rollups(now=minute + 600) == 1 and not GpuHourlyRollup.objects.exists()


def test_a_retried_flush_never_double_counts(settings, monkeypatch) -> None:
    _, token = registered_node("n1", ("A100-80GB",))
    minute = int(time.time() // 60 * 60) - 180
    _feed_minute(token, minute, [50, 70])
    later = minute + 600
    # A flush that dies after its commit but before deleting the accumulator...
    from apps.telemetry import rollups

    real_pipeline = get_redis().pipeline

    class Boom(Exception):
        pass

    def dying_pipeline(*a, **k):
        raise Boom

    monkeypatch.setattr(rollups.get_redis(), "pipeline", dying_pipeline)
    with pytest.raises(Boom):
        flush_rollups(now=later)
    monkeypatch.setattr(rollups.get_redis(), "pipeline", real_pipeline)
    assert GpuRollup.objects.get().samples == 2
    # ...is retried: same values, one row. And a duplicate run after that finds nothing to do.
    assert flush_rollups(now=later) == 1
    assert flush_rollups(now=later) == 0
    r = GpuRollup.objects.get()
    assert (r.samples, r.util_mean) == (2, 60.0)


def test_hours_are_recomputed_from_minutes_weighted_by_samples() -> None:
    node, _ = registered_node("n1", ("A100-80GB",))
    gpu = node.gpus.get()
    hour = datetime(2026, 11, 3, 10, tzinfo=UTC)
    GpuRollup.objects.create(
        gpu=gpu,
        minute=hour,
        samples=60,
        util_min=0,
        util_mean=10.0,
        util_max=20,
        mem_used_mean=100.0,
        mem_used_max=200,
        temp_max=40,
        power_mean=100.0,
    )
    GpuRollup.objects.create(
        gpu=gpu,
        minute=hour + timedelta(minutes=1),
        samples=20,
        util_min=50,
        util_mean=90.0,
        util_max=100,
        mem_used_mean=None,
        mem_used_max=None,
        temp_max=70,
        power_mean=300.0,
    )
    GpuRollup.objects.create(gpu=gpu, minute=hour + timedelta(hours=1), samples=60, util_mean=99.0)  # next hour
    assert rollup_hour(hour=hour + timedelta(minutes=30)) == 1
    assert rollup_hour(hour=hour) == 1  # again: same row
    h = GpuHourlyRollup.objects.get()
    assert h.hour == hour and h.samples == 80
    assert (h.util_min, h.util_max, h.temp_max, h.mem_used_max) == (0, 100, 70, 200)
    assert h.util_mean == 30.0  # (10*60 + 90*20) / 80
    assert h.mem_used_mean == 100.0  # the minute without memory readings does not count
    assert h.power_mean == 150.0


def test_retention_prunes_old_rows(settings) -> None:
    settings.TELEMETRY_MINUTE_RETENTION_DAYS = 14
    settings.TELEMETRY_HOURLY_RETENTION_DAYS = 365
    node, _ = registered_node("n1", ("A100-80GB",))
    gpu = node.gpus.get()
    now = datetime(2026, 12, 1, tzinfo=UTC)
    GpuRollup.objects.create(gpu=gpu, minute=now - timedelta(days=15), samples=1)
    GpuRollup.objects.create(gpu=gpu, minute=now - timedelta(days=13), samples=1)
    GpuHourlyRollup.objects.create(gpu=gpu, hour=now - timedelta(days=400), samples=1)
    GpuHourlyRollup.objects.create(gpu=gpu, hour=now - timedelta(days=300), samples=1)
    assert prune(now=now) == (1, 1)
    assert GpuRollup.objects.count() == 1 and GpuHourlyRollup.objects.count() == 1
