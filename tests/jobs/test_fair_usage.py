"""The scheduler's decayed usage per team: PostgreSQL sums it in SQL, equal to the core's integral per job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Q
from django.utils import timezone

from apps.jobs import scheduler
from apps.jobs.models import Job
from apps.jobs.scheduling import decayed_gpu_seconds

HOUR = 3600.0


def _ran(team: Any, user: Any, gpus: int, started: Any, ended: Any) -> None:
    job = Job(team=team, user=user, image="local/process", command=["true"], gpu_count=gpus, cpus=1,
              memory_mib=64, max_duration_s=3600, state="succeeded" if ended else "running",
              started_at=started, ended_at=ended)  # fmt: skip
    job.save()


def _history(alice: Any, charlie: Any, vision: Any, nlp: Any, now: Any) -> dict[str, float]:
    """Jobs of two teams around `now`; returns the expected usage, computed one job at a time."""
    half_life = 2 * HOUR
    rows = [
        (vision, alice, 2, now - timedelta(hours=3), now - timedelta(hours=1)),  # ended, decayed
        (vision, alice, 1, now - timedelta(minutes=30), None),  # running
        (vision, alice, 4, now - timedelta(days=400), None),  # running for a year: its start term underflows
        (nlp, charlie, 8, now - timedelta(hours=2), now - timedelta(minutes=5)),
        (nlp, charlie, 1, now - timedelta(hours=1), now + timedelta(minutes=5)),  # end after now: counted to now
        (nlp, charlie, 3, now - timedelta(hours=30), now - timedelta(hours=9)),  # ended before the horizon
        (nlp, charlie, 2, now - timedelta(minutes=1), now - timedelta(minutes=1)),  # zero length
    ]
    expected: dict[str, float] = {}
    horizon = now - timedelta(seconds=half_life * 4)
    for team, user, gpus, started, ended in rows:
        _ran(team, user, gpus, started, ended)
        if ended is not None and ended <= horizon:
            continue
        end = scheduler.epoch(ended) if ended else scheduler.epoch(now)
        value = decayed_gpu_seconds(gpus, scheduler.epoch(started), end, scheduler.epoch(now), half_life)
        expected[str(team.pk)] = expected.get(str(team.pk), 0.0) + value
    return expected


@pytest.mark.django_db
def test_the_usage_cache_gives_each_teams_decayed_gpu_seconds(alice, charlie, vision, nlp) -> None:
    now = timezone.now()
    expected = _history(alice, charlie, vision, nlp, now)

    usage = scheduler.UsageCache(half_life_s=2 * HOUR).get(now)

    assert usage.keys() == expected.keys()
    for team, value in expected.items():
        assert usage[team] == pytest.approx(value, rel=1e-9, abs=1e-6)


def _usage_job_by_job(*, now: Any, horizon: Any, half_life_s: float) -> dict[str, float]:
    """The reference: the core's `decayed_gpu_seconds` summed over each job row that ran since `horizon`."""
    now_s = scheduler.epoch(now)
    usage: dict[str, float] = {}
    rows = (
        Job.objects.filter(started_at__isnull=False)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=horizon))
        .values_list("team_id", "gpu_count", "started_at", "ended_at")
    )
    for team_id, gpus, started, ended in rows:
        end = scheduler.epoch(ended) if ended else now_s
        key = str(team_id)
        usage[key] = usage.get(key, 0.0) + decayed_gpu_seconds(gpus, scheduler.epoch(started), end, now_s, half_life_s)
    return usage


@pytest.mark.django_db
def test_the_sql_sum_equals_the_job_by_job_reference(alice, charlie, vision, nlp) -> None:
    now = timezone.now()
    _history(alice, charlie, vision, nlp, now)
    horizon = now - timedelta(hours=8)

    in_sql = scheduler.team_usage(now=now, horizon=horizon, half_life_s=2 * HOUR)
    in_python = _usage_job_by_job(now=now, horizon=horizon, half_life_s=2 * HOUR)

    assert in_sql.keys() == in_python.keys() and len(in_sql) == 2
    for team, value in in_python.items():
        assert in_sql[team] == pytest.approx(value, rel=1e-9, abs=1e-6)
