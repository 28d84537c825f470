"""Properties over random fleets: no double allocation, gangs on one node, reservations and the shadow kept."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.jobs.scheduling import (
    BACKFILL,
    FAIR,
    FIFO,
    Gpu,
    PendingJob,
    Reservation,
    RunningJob,
    Snapshot,
    schedule,
)

NOW = 50_000.0
MODELS = ["A100", "T4", "V100"]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    node_count = draw(st.integers(1, 5))
    fleet: list[Gpu] = []
    for n in range(node_count):
        model = draw(st.sampled_from(MODELS))
        size = draw(st.sampled_from([1, 2, 4, 8]))
        fleet.extend(Gpu(f"n{n}-g{i}", f"n{n}", model) for i in range(size))
    ids = [g.id for g in fleet]
    teams = ["a", "b", "c"]

    taken: set[str] = set()
    reservations: list[Reservation] = []
    for r in range(draw(st.integers(0, 3))):
        members = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=4, unique=True))
        members = [g for g in members if g not in taken]
        if not members:
            continue
        taken.update(members)  # portal reservations never overlap on a GPU
        start = NOW + draw(st.integers(-3000, 3000))
        end = start + draw(st.integers(100, 6000))
        reservations.append(Reservation(f"R{r}", draw(st.sampled_from(teams)), frozenset(members), start, end))

    busy: set[str] = set()
    running: list[RunningJob] = []
    for j in range(draw(st.integers(0, 6))):
        members = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        members = [g for g in members if g not in busy]
        if not members:
            continue
        busy.update(members)
        duration = float(draw(st.integers(10, 8000)))
        start = NOW - draw(st.integers(0, 5000))
        running.append(RunningJob(f"run{j}", draw(st.sampled_from(teams)), tuple(members), start, duration))

    pending: list[PendingJob] = []
    resv_ids = [r.id for r in reservations]
    for j in range(draw(st.integers(0, 25))):
        models = draw(st.one_of(st.none(), st.sets(st.sampled_from(MODELS), min_size=1).map(frozenset)))
        bound = draw(st.one_of(st.none(), st.sampled_from(resv_ids))) if resv_ids else None
        pending.append(
            PendingJob(
                id=f"p{j:02d}",
                team=draw(st.sampled_from(teams)),
                user="u",
                gpu_count=draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8])),
                max_duration_s=float(draw(st.integers(30, 10000))),
                submitted_at=NOW - draw(st.integers(0, 4000)),
                models=models,
                priority=draw(st.sampled_from([0, 0, 0, 1])),
                reservation_id=bound,
            )
        )
    partial = set(draw(st.lists(st.sampled_from(ids), max_size=2, unique=True)))
    fleet = [Gpu(g.id, g.node, g.model, 1.0, 0.0 if g.id in busy else (0.5 if g.id in partial else 1.0)) for g in fleet]
    usage = {t: float(draw(st.integers(0, 10**6))) for t in teams}
    return Snapshot(tuple(fleet), tuple(pending), tuple(running), tuple(reservations), usage, {})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_decisions_keep_every_invariant(snap: Snapshot) -> None:
    gpu = {g.id: g for g in snap.gpus}
    unavailable = {gid for r in snap.running for gid in r.gpu_ids} | {g.id for g in snap.gpus if g.free < 1.0}
    jobs = {j.id: j for j in snap.pending}
    resv = {r.id: r for r in snap.reservations}
    for policy in (FIFO, BACKFILL, FAIR):
        decisions = schedule(snap, policy=policy, now=NOW)
        assert decisions == schedule(snap, policy=policy, now=NOW)

        used: set[str] = set()
        for start in decisions.starts:
            job = jobs[start.job_id]
            assert len(start.gpu_ids) == job.gpu_count
            assert not used.intersection(start.gpu_ids), "GPU allocated twice in one decision set"
            used.update(start.gpu_ids)
            assert not unavailable.intersection(start.gpu_ids), "GPU already in use"
            assert {gpu[g].node for g in start.gpu_ids} == {start.node}, "gang spans nodes"
            if job.models is not None:
                assert all(gpu[g].model in job.models for g in start.gpu_ids)
            end = NOW + job.max_duration_s
            assert start.expected_end == end
            if job.reservation_id is not None:
                r = resv[job.reservation_id]
                assert set(start.gpu_ids) <= r.gpu_ids
                assert r.start <= NOW and end <= r.end and r.team == job.team
            else:
                for r in snap.reservations:
                    if r.gpu_ids.intersection(start.gpu_ids):
                        assert end <= r.start or r.end <= NOW, "unbound job overlaps a reservation"

        started = {s.job_id for s in decisions.starts}
        assert started | set(decisions.pending_reasons) == set(jobs)
        assert not started & set(decisions.pending_reasons)

        planned = decisions.planned
        if policy is FIFO:
            assert planned is None
        if planned is not None:
            holders = [(s.gpu_ids, s.expected_end) for s in decisions.starts]
            holders += [(r.gpu_ids, r.expected_end) for r in snap.running]
            for gpu_ids, end in holders:
                if set(gpu_ids) & set(planned.gpu_ids):
                    assert end <= planned.start + 1e-6, "the head's planned start is delayed"
            head = jobs[planned.job_id]
            for r in snap.reservations:
                if r.gpu_ids.intersection(planned.gpu_ids):
                    assert planned.start + head.max_duration_s <= r.start or r.end <= planned.start
