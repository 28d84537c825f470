"""The reservation serializers render from a plan (FastOutputMixin): the output must be exactly DRF's."""

from __future__ import annotations

from typing import Any

import pytest

from apps.booking import services
from apps.booking.api.serializers import ReservationCreatedOutput, ReservationOutput
from apps.booking.models import Reservation
from tests.booking.conftest import slot
from tests.core.test_fast_output import drf_render

pytestmark = pytest.mark.django_db


def test_reservation_output_is_what_drf_builds(alice: Any, fleet: Any) -> None:
    team = alice.memberships.first().team
    start, end = slot(hours=2)
    created = services.reservation_create(user=alice, team=team, start=start, end=end, gpus=["GPU-big-0", "GPU-big-1"])
    later = services.reservation_create(user=alice, team=team, start=end, end=end + (end - start), gpu_count=1,
                                        gpu_model="A100-80GB", note="second")  # fmt: skip
    warnings = [{"kind": "budget", "message": "over the soft limit"}]
    fast = ReservationCreatedOutput(created.reservation, context={"warnings": warnings}).data
    assert fast == drf_render(ReservationCreatedOutput(created.reservation, context={"warnings": warnings}))
    assert fast["warnings"] == warnings and [g["uuid"] for g in fast["gpus"]] == ["GPU-big-0", "GPU-big-1"]
    rows = list(Reservation.objects.filter(pk__in=[created.reservation.pk, later.reservation.pk]).order_by("pk"))
    listed = ReservationOutput(rows, many=True).data
    assert listed == drf_render(ReservationOutput(rows, many=True))
    assert listed[1]["note"] == "second" and listed[1]["gpu_model"] == "A100-80GB"
    assert ReservationCreatedOutput.__dict__["_output_plan"] is not None
