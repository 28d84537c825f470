"""Small builders for scheduling snapshots, so each test states only what matters to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from apps.jobs.scheduling import Gpu, PendingJob, Reservation, RunningJob, Snapshot

NOW = 1_000_000.0


def gpus(layout: Mapping[str, tuple[str, int]]) -> list[Gpu]:
    """``{"n1": ("A100", 8)}`` -> GPUs n1-g0 .. n1-g7."""
    out: list[Gpu] = []
    for node, (model, count) in layout.items():
        out.extend(Gpu(id=f"{node}-g{i}", node=node, model=model) for i in range(count))
    return out


def job(
    job_id: str,
    *,
    gpus: int = 1,
    duration: float = 3600.0,
    submitted: float = NOW - 100.0,
    team: str = "vision",
    models: Iterable[str] | None = None,
    priority: int = 0,
    reservation: str | None = None,
) -> PendingJob:
    """A pending job with sensible defaults."""
    return PendingJob(
        id=job_id,
        team=team,
        user=f"user-{team}",
        gpu_count=gpus,
        max_duration_s=duration,
        submitted_at=submitted,
        models=frozenset(models) if models is not None else None,
        priority=priority,
        reservation_id=reservation,
    )


def running(
    job_id: str,
    gpu_ids: Iterable[str],
    *,
    ends_in: float,
    team: str = "vision",
    reservation: str | None = None,
) -> RunningJob:
    """A running job expected to end ``ends_in`` seconds after NOW."""
    return RunningJob(
        id=job_id,
        team=team,
        gpu_ids=tuple(gpu_ids),
        start=NOW - 60.0,
        max_duration_s=60.0 + ends_in,
        reservation_id=reservation,
    )


def reservation(
    rid: str, gpu_ids: Iterable[str], *, start_in: float, end_in: float, team: str = "vision"
) -> Reservation:
    """A portal reservation [NOW + start_in, NOW + end_in)."""
    return Reservation(id=rid, team=team, gpu_ids=frozenset(gpu_ids), start=NOW + start_in, end=NOW + end_in)


def snapshot(
    gpu_list: Iterable[Gpu],
    pending: Iterable[PendingJob],
    *,
    run: Iterable[RunningJob] = (),
    reservations: Iterable[Reservation] = (),
    usage: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
) -> Snapshot:
    """A snapshot; GPUs held by ``run`` are reported with no free capacity, as the shell would."""
    run = tuple(run)
    busy = {g for r in run for g in r.gpu_ids}
    return Snapshot(
        gpus=tuple(Gpu(g.id, g.node, g.model, g.capacity, 0.0) if g.id in busy else g for g in gpu_list),
        pending=tuple(pending),
        running=run,
        reservations=tuple(reservations),
        team_usage=dict(usage or {}),
        team_shares=dict(shares or {}),
    )
