"""Rows the page tests need, written directly (the pages only read them)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from apps.booking.models import Reservation, ReservationStatus
from apps.jobs.models import Job, JobState


def job(team: Any, user: Any, *, state: str = JobState.QUEUED, name: str = "", **extra: Any) -> Job:
    return Job.objects.create(
        team=team,
        user=user,
        name=name,
        image="local/process",
        command=extra.pop("command", ["python", "train.py"]),
        gpu_count=extra.pop("gpu_count", 1),
        cpus=Decimal("2"),
        memory_mib=4096,
        max_duration_s=3600,
        state=state,
        **extra,
    )


def reservation(
    team: Any,
    user: Any,
    *,
    start: datetime | None = None,
    hours: float = 2,
    status: str = ReservationStatus.BOOKED,
    gpu_model: Any = None,
    gpu_count: int = 1,
) -> Reservation:
    start = start or timezone.now() + timedelta(hours=1)
    end = start + timedelta(hours=hours)
    return Reservation.objects.create(
        team=team,
        user=user,
        gpu_model=gpu_model,
        gpu_count=gpu_count,
        start=start,
        end=end,
        booked_end=end,
        status=status,
    )
