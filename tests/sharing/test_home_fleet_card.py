"""The home page's fleet card counts GPUs as the Fleet page does: a GPU any part of which is held now is busy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

from apps.booking import services as booking
from apps.fleet.models import Gpu


def test_the_fleet_card_counts_a_partly_held_gpu_as_busy_and_leaves_out_retired_ones(
    sharing_fleet: dict[str, Any], alice: Any, vision: Any
) -> None:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    later = start + timedelta(hours=3)
    booking.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=2), mig_profile="1g.10gb"
    )
    booking.reservation_create(user=alice, team=vision, start=start, end=start + timedelta(hours=2), gpus=["GPU-mig-1"])
    # A share booked for later holds nothing now: its GPU is still free.
    booking.reservation_create(
        user=alice, team=vision, start=later, end=later + timedelta(hours=1), gpu_share="0.25", gpus=["GPU-shared-0"]
    )
    Gpu.objects.filter(uuid="GPU-shared-1").update(retired_at=timezone.now())
    client = Client()
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert '<p class="big" id="home-gpus-free">1 / 3</p>' in html
    assert "GPUs free now; 3 in service on 2 of 2 nodes online" in html
