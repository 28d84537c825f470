"""Demo data for efficiency: a short idle policy for team vision (a reservation booked now and left idle is warned
after 10 minutes and released 5 minutes later, so the demo shows it within a coffee break), and the telemetry of a
job that ran out of GPU memory (minute rollups whose memory climbs to the GPU's capacity: the job page plots it,
the advice reads it; apps/jobs/demo.py calls it). Idempotent."""

from __future__ import annotations

from datetime import datetime, timedelta

from apps.accounts.models import Team
from apps.efficiency.models import IdlePolicy
from apps.fleet.models import Gpu
from apps.telemetry.models import GpuRollup


def oom_memory_curve(*, gpu: Gpu, start: datetime, minutes: int) -> int:
    """Memory from ~35% of the GPU rising to its capacity over `minutes`, utilization 85-95%; returns rows written."""
    total = gpu.memory_mib
    first = start.replace(second=0, microsecond=0)
    rows = []
    for i in range(max(minutes, 1)):
        share = 0.35 + 0.65 * ((i + 1) / max(minutes, 1)) ** 2
        mem = min(total, int(total * share))
        util = 85 + (i * 7) % 11
        rows.append(
            GpuRollup(
                gpu=gpu,
                minute=first + timedelta(minutes=i),
                samples=60,
                util_min=util - 10,
                util_mean=float(util),
                util_max=min(100, util + 5),
                mem_used_mean=float(mem - 512),
                mem_used_max=mem,
            )
        )
    return len(GpuRollup.objects.bulk_create(rows, ignore_conflicts=True))


def load() -> None:
    team = Team.objects.filter(slug="vision").first()
    if team is not None:
        IdlePolicy.objects.get_or_create(
            team=team, defaults={"warn_after_min": 10, "reclaim_after_min": 5, "unused_release_after_min": 20}
        )
