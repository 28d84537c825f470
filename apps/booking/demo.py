"""Demo data for booking (embedded default only): GPU model prices, quotas for vision and nlp, the booking policy,
and a few reservations in the coming days on whatever GPUs exist, two of them on slices (a MIG instance, a
share). Safe to call again: nothing is duplicated, and the reservations are added on the first call that finds
GPUs."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.accounts.models import Team
from apps.booking import selectors, services
from apps.booking.models import BookingPolicy, Quota, Reservation
from apps.core.errors import ApplicationError
from apps.fleet.models import GpuModel

logger = logging.getLogger(__name__)

# Names are the node agent's model keys (workers/gpu/specs.py), so registered GPUs and prices meet.
MODELS = [
    ("A100-80GB", "NVIDIA A100 80GB", 81920, Decimal("2.2000")),
    ("H100-80GB", "NVIDIA H100 80GB", 81920, Decimal("3.9000")),
    ("H200-141GB", "NVIDIA H200", 144384, Decimal("4.8000")),
    ("L40S-48GB", "NVIDIA L40S", 46068, Decimal("1.1000")),
    ("V100-32GB", "NVIDIA V100 32GB", 32768, Decimal("0.6000")),
]

DEMO_NOTE = "demo: "


def _models() -> None:
    for name, display, memory, price in MODELS:
        model, created = GpuModel.objects.get_or_create(
            name=name, defaults={"display_name": display, "memory_mib": memory, "hourly_price": price}
        )
        if not created and model.hourly_price == 0:
            # Registered by an agent first (price 0 until set): give it the demo price.
            GpuModel.objects.filter(pk=model.pk).update(hourly_price=price, display_name=model.display_name or display)


def _quotas() -> None:
    vision = Team.objects.filter(slug="vision").first()
    nlp = Team.objects.filter(slug="nlp").first()
    if vision is not None:
        Quota.objects.get_or_create(
            team=vision,
            month=None,
            defaults={
                "gpu_hours": Decimal("2000"),
                "max_concurrent_gpus": 8,
                "budget_soft": Decimal("4000"),
                "budget_hard": Decimal("5000"),
            },
        )
    if nlp is not None:
        quota, created = Quota.objects.get_or_create(
            team=nlp,
            month=None,
            defaults={
                "gpu_hours": Decimal("600"),
                "max_concurrent_gpus": 4,
                "budget_soft": Decimal("1000"),
                "budget_hard": Decimal("1500"),
            },
        )
        if created:
            quota.allowed_models.set(GpuModel.objects.filter(name__in=["A100-80GB", "L40S-48GB", "V100-32GB"]))


def _reservations() -> None:
    if Reservation.objects.filter(note__startswith=DEMO_NOTE).exists():
        return
    users = {u.username: u for u in get_user_model().objects.filter(username__in=["alice", "bob", "carol"])}
    teams = {t.slug: t for t in Team.objects.filter(slug__in=["vision", "nlp"])}
    models = [m for m in GpuModel.objects.filter(gpus__isnull=False).distinct().order_by("hourly_price")]
    if not models or not users or not teams:
        return  # no GPUs yet: the next call (after the agent registered) adds them
    tz = selectors.local_tz()
    today = timezone.now().astimezone(tz).replace(hour=0, minute=0, second=0, microsecond=0)
    plans = [
        ("vision", "alice", 1, 9, 8, 2, "training run: detector v3"),
        ("nlp", "carol", 1, 13, 4, 1, "fine-tuning"),
        ("vision", "bob", 2, 8, 12, 1, "ablation sweep"),
        ("nlp", "carol", 3, 10, 6, 2, "eval harness"),
        ("vision", "alice", 5, 0, 24, 4, "long training run"),
    ]
    for team, user, day, hour, hours, count, note in plans:
        if team not in teams or user not in users:
            continue
        start = today + timedelta(days=day, hours=hour)
        for model in models:
            try:
                services.reservation_create(
                    user=users[user],
                    team=teams[team],
                    start=start,
                    end=start + timedelta(hours=hours),
                    gpu_count=count,
                    gpu_model=model,
                    note=DEMO_NOTE + note,
                    include_offline=True,  # the local agent may not have connected yet
                )
                break
            except ApplicationError as exc:  # not enough of this model, or not allowed: try the next
                logger.debug("demo booking %s on %s skipped: %s", note, model.name, exc.detail)
    # Slices: an instance of the GPU in MIG mode and a quarter of the GPU split in four (apps.fleet.demo).
    slices: list[tuple[str, str, int, int, int, dict[str, Any], str]] = [
        ("vision", "bob", 1, 9, 6, {"mig_profile": "1g.10gb"}, "notebook on a MIG instance"),
        ("vision", "alice", 2, 10, 8, {"gpu_share": Decimal("0.25")}, "inference service on a quarter GPU"),
    ]
    for team, user, day, hour, hours, part, note in slices:
        if team not in teams or user not in users:
            continue
        start = today + timedelta(days=day, hours=hour)
        try:
            services.reservation_create(
                user=users[user], team=teams[team], start=start, end=start + timedelta(hours=hours), gpu_count=1,
                note=DEMO_NOTE + note, include_offline=True, **part,
            )  # fmt: skip
        except ApplicationError as exc:  # a fleet without parts (real GPUs): no slice bookings
            logger.debug("demo booking %s skipped: %s", note, exc.detail)


def load() -> None:
    _models()
    BookingPolicy.objects.get_or_create(pk=1)
    _quotas()
    _reservations()
