"""The ledger's utilization from the hourly rollups (where the minutes are pruned) reads UTC hours: a piece that
starts at local midnight in India (18:30 UTC) still finds the hour of 18:00 UTC it starts in."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from apps.billing.selectors.utilization import mean_utilizations
from apps.telemetry.models import GpuHourlyRollup
from apps.telemetry.rollups import rollup_hour
from tests.billing import helpers

pytestmark = pytest.mark.django_db


def test_a_piece_from_a_local_midnight_half_an_hour_off_utc_finds_its_hour():
    [gpu] = helpers.gpus(1)
    GpuHourlyRollup.objects.create(gpu=gpu, hour=datetime(2026, 10, 4, 18, tzinfo=UTC), samples=3600, util_mean=40.0)
    midnight = datetime(2026, 10, 5, tzinfo=ZoneInfo("Asia/Kolkata"))  # 18:30 UTC on the 4th
    assert mean_utilizations([(gpu.pk, midnight, datetime(2026, 10, 4, 19, tzinfo=UTC))]) == [Decimal("0.4")]


def test_an_hour_given_in_local_time_is_rolled_up_as_its_utc_hour():
    [gpu] = helpers.gpus(1)
    from tests.efficiency.conftest import write_minutes

    write_minutes(gpu, datetime(2026, 10, 4, 18, 0, tzinfo=UTC), 60, util=30, mem=100)
    assert rollup_hour(hour=datetime(2026, 10, 5, 0, 10, tzinfo=ZoneInfo("Asia/Kolkata"))) == 1  # 18:40 UTC
    (row,) = GpuHourlyRollup.objects.all()
    assert row.hour == datetime(2026, 10, 4, 18, tzinfo=UTC) and row.samples == 3600
