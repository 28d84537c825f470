"""fifo, backfill and fair: who goes first, who may jump ahead, and that nobody waits forever."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from apps.jobs.scheduling import (
    BACKFILL,
    FAIR,
    FIFO,
    Decisions,
    PendingJob,
    Policy,
    ReasonCode,
    RunningJob,
    Snapshot,
    StopReason,
    policy_by_name,
    schedule,
)
from tests.scheduling.builders import NOW, gpus, job, reservation, running, snapshot

# One node of 4 GPUs; 2 are busy for another 1000 s.
FLEET = gpus({"n1": ("A100", 4)})
BUSY = [running("r", ["n1-g0", "n1-g1"], ends_in=1000)]


def test_policy_by_name_knows_the_three_policies() -> None:
    assert [policy_by_name(n).name for n in ("fifo", "backfill", "fair")] == ["fifo", "backfill", "fair"]


def test_fifo_head_blocks_the_rest() -> None:
    pending = [job("head", gpus=4, submitted=NOW - 300), job("small", gpus=1, duration=10, submitted=NOW - 200)]
    decisions = schedule(snapshot(FLEET, pending, run=BUSY), policy=FIFO, now=NOW)

    assert decisions.starts == ()
    assert decisions.planned is None
    assert decisions.pending_reasons["small"].code == ReasonCode.BEHIND_HEAD
    assert "head" in decisions.pending_reasons["small"].message


def test_fifo_is_strict_arrival_order_regardless_of_priority() -> None:
    pending = [job("old", gpus=2, submitted=NOW - 300), job("urgent", gpus=2, submitted=NOW - 10, priority=10)]
    decisions = schedule(snapshot(FLEET, pending, run=BUSY), policy=FIFO, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["old"]


def test_backfill_starts_a_short_job_that_ends_before_the_head_can_start() -> None:
    pending = [job("head", gpus=4, submitted=NOW - 300), job("short", gpus=2, duration=900, submitted=NOW - 200)]
    decisions = schedule(snapshot(FLEET, pending, run=BUSY), policy=BACKFILL, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["short"]
    assert decisions.starts[0].backfilled
    assert decisions.planned is not None
    assert decisions.planned.job_id == "head"
    assert decisions.planned.start == NOW + 1000
    assert decisions.pending_reasons["head"].code == ReasonCode.NEXT_IN_LINE


def test_backfill_refuses_a_job_that_would_delay_the_head() -> None:
    pending = [job("head", gpus=4, submitted=NOW - 300), job("long", gpus=2, duration=1001, submitted=NOW - 200)]
    decisions = schedule(snapshot(FLEET, pending, run=BUSY), policy=BACKFILL, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["long"].code == ReasonCode.WOULD_DELAY_NEXT


def test_backfill_lets_a_long_job_use_gpus_the_head_does_not_need() -> None:
    fleet = gpus({"n1": ("A100", 4), "n2": ("A100", 2)})
    pending = [job("head", gpus=4, submitted=NOW - 300), job("long", gpus=2, duration=10**6, submitted=NOW - 200)]
    decisions = schedule(snapshot(fleet, pending, run=BUSY), policy=BACKFILL, now=NOW)

    assert [(s.job_id, s.node) for s in decisions.starts] == [("long", "n2")]


def test_backfill_shadow_is_computed_from_expected_ends_and_this_pass_starts() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    pending = [
        job("first", gpus=1, duration=500, submitted=NOW - 300),
        job("head", gpus=2, submitted=NOW - 200),
    ]
    run = [running("r", ["n1-g0"], ends_in=100)]
    decisions = schedule(snapshot(fleet, pending, run=run), policy=BACKFILL, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["first"]
    assert decisions.planned is not None
    assert decisions.planned.start == NOW + 500


def test_fair_share_team_over_its_share_goes_after() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    pending = [
        job("heavy", team="heavy", submitted=NOW - 600),
        job("light", team="light", submitted=NOW - 60),
    ]
    usage = {"heavy": 500 * 3600.0, "light": 10 * 3600.0}
    decisions = schedule(snapshot(fleet, pending, usage=usage), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["light"]


def test_fair_share_respects_unequal_shares() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    pending = [job("a", team="a", submitted=NOW - 60), job("b", team="b", submitted=NOW - 60)]
    usage = {"a": 300.0 * 3600, "b": 100.0 * 3600}
    # a used 3x what b used but is entitled to 9x: a is below its share, b above.
    decisions = schedule(snapshot(fleet, pending, usage=usage, shares={"a": 9, "b": 1}), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["a"]


def test_fair_priority_comes_first() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    pending = [
        job("low", team="idle", submitted=NOW - 3600, duration=60),
        job("high", team="busy", submitted=NOW - 10, duration=10**5, priority=5),
    ]
    decisions = schedule(snapshot(fleet, pending, usage={"busy": 10**7}), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["high"]


def test_fair_prefers_short_estimates_among_equals() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    pending = [job("long", duration=3 * 86400, submitted=NOW - 120), job("short", duration=600, submitted=NOW - 60)]
    decisions = schedule(snapshot(fleet, pending), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["short"]
    # The top of the fair order that could not start holds the shadow reservation.
    assert decisions.planned is not None and decisions.planned.job_id == "long"


def test_fair_interleaves_two_teams_submitting_at_once() -> None:
    fleet = gpus({"n1": ("A100", 4)})
    pending = [job(f"a{i}", team="a", submitted=NOW - 100 + i) for i in range(4)]
    pending += [job(f"b{i}", team="b", submitted=NOW - 100 + i) for i in range(4)]
    decisions = schedule(snapshot(fleet, pending), policy=FAIR, now=NOW)

    teams = sorted(s.job_id[0] for s in decisions.starts)
    assert teams == ["a", "a", "b", "b"]


def _simulate(
    policy: Policy,
    arrivals: list[PendingJob],
    *,
    gpu_count: int,
    until: float,
    on_pass: Callable[[Decisions], None] | None = None,
) -> dict[str, float]:
    """Run the core in simulated time; jobs run exactly their estimate. Returns job id -> start time."""
    fleet = gpus({"n1": ("A100", gpu_count)})
    arrivals = sorted(arrivals, key=lambda j: j.submitted_at)
    pending: dict[str, PendingJob] = {}
    runs: dict[str, RunningJob] = {}
    started: dict[str, float] = {}
    now = arrivals[0].submitted_at
    while now <= until:
        for r in [r for r in runs.values() if r.expected_end <= now]:
            del runs[r.id]
        while arrivals and arrivals[0].submitted_at <= now:
            j = arrivals.pop(0)
            pending[j.id] = j
        decisions = schedule(snapshot(fleet, pending.values(), run=runs.values()), policy=policy, now=now)
        if on_pass is not None:
            on_pass(decisions)
        for s in decisions.starts:
            j = pending.pop(s.job_id)
            runs[j.id] = RunningJob(j.id, j.team, s.gpu_ids, now, j.max_duration_s)
            started[j.id] = now
        events = [r.expected_end for r in runs.values()] + ([arrivals[0].submitted_at] if arrivals else [])
        if not events:
            break
        now = min(events)
    return started


def test_ageing_lets_a_long_job_start_despite_a_stream_of_short_ones() -> None:
    start = NOW
    long_job = job("long", duration=12 * 3600, submitted=start)
    # A new 10-minute job every 5 minutes keeps the single GPU busy forever.
    stream = [job(f"s{i:05d}", duration=600, submitted=start - 200 + 300 * i) for i in range(2000)]
    started = _simulate(FAIR, [long_job, *stream], gpu_count=1, until=start + 6 * 86400)

    bound = FAIR.size_weight_s + FAIR.fairshare_weight_s + 3600
    assert "long" in started
    assert started["long"] - start > 3600  # it did wait behind shorter jobs...
    assert started["long"] - start <= bound  # ...but only for a bounded time


def test_without_a_bound_on_the_size_penalty_the_long_job_would_starve() -> None:
    # The same stream under a policy whose size penalty outweighs any wait: the long job never starts,
    # which shows the previous test measures ageing, not luck.
    greedy = dataclasses.replace(FAIR, name="sjf", size_weight_s=10**9)
    start = NOW
    long_job = job("long", duration=12 * 3600, submitted=start)
    stream = [job(f"s{i:05d}", duration=600, submitted=start - 200 + 300 * i) for i in range(600)]
    started = _simulate(greedy, [long_job, *stream], gpu_count=1, until=start + 2 * 86400)

    assert "long" not in started


def test_backfill_head_starts_no_later_than_planned_when_jobs_run_their_estimates() -> None:
    rng = random.Random(7)
    jobs = [
        job(
            f"j{i:03d}",
            gpus=rng.choice([1, 1, 1, 2, 4]),
            duration=rng.choice([60, 600, 3600, 7200]),
            submitted=NOW + i,
        )
        for i in range(60)
    ]
    fleet_size = 4
    head_plans: dict[str, float] = {}

    def remember(decisions: Decisions) -> None:
        if decisions.planned is not None:
            head_plans.setdefault(decisions.planned.job_id, decisions.planned.start)

    started = _simulate(BACKFILL, jobs, gpu_count=fleet_size, until=NOW + 10**6, on_pass=remember)
    assert head_plans
    for job_id, planned in head_plans.items():
        assert started[job_id] <= planned + 1e-6


def test_portal_reservation_is_never_delayed_by_backfill() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    resv = reservation("R", ["n1-g0", "n1-g1"], start_in=1000, end_in=5000, team="other")
    pending = [
        job("fits", duration=1000, submitted=NOW - 30),
        job("too-long", duration=1001, submitted=NOW - 20),
        job("also-too-long", duration=2000, submitted=NOW - 10),
    ]
    decisions = schedule(snapshot(fleet, pending, reservations=[resv]), policy=BACKFILL, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["fits"]
    # The head is planned after the reservation, not inside it.
    assert decisions.planned is not None
    assert (decisions.planned.job_id, decisions.planned.start) == ("too-long", NOW + 5000)
    assert decisions.pending_reasons["also-too-long"].code == ReasonCode.HELD_BY_RESERVATION


def test_determinism_same_decisions_whatever_the_input_order() -> None:
    rng = random.Random(3)
    fleet = gpus({"a": ("A100", 8), "b": ("A100", 8), "c": ("T4", 4), "d": ("T4", 2)})
    pending = [
        job(
            f"j{i}",
            gpus=rng.choice([1, 1, 2, 4, 8]),
            duration=rng.choice([600, 3600, 86400]),
            submitted=NOW - rng.randrange(10) * 60,
            team=rng.choice(["x", "y", "z"]),
            models=rng.choice([None, None, {"T4"}, {"A100"}]),
        )
        for i in range(40)
    ]
    run = [running("r1", ["a-g0", "a-g1"], ends_in=100), running("r2", ["c-g3"], ends_in=50, team="y")]
    usage = {"x": 10.0, "y": 5000.0}
    for policy in (FIFO, BACKFILL, FAIR):
        base = schedule(snapshot(fleet, pending, run=run, usage=usage), policy=policy, now=NOW)
        for _ in range(3):
            shuffled_fleet = list(fleet)
            shuffled_pending = list(pending)
            rng.shuffle(shuffled_fleet)
            rng.shuffle(shuffled_pending)
            again = schedule(snapshot(shuffled_fleet, shuffled_pending, run=run, usage=usage), policy=policy, now=NOW)
            assert again.starts == base.starts
            assert again.planned == base.planned
            assert dict(again.pending_reasons) == dict(base.pending_reasons)


def test_running_job_past_its_max_duration_is_stopped() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    run = [running("late", ["n1-g0"], ends_in=-1), running("fine", ["n1-g1"], ends_in=10)]
    decisions = schedule(snapshot(fleet, [], run=run), policy=FAIR, now=NOW)

    assert [(s.job_id, s.reason) for s in decisions.stops] == [("late", StopReason.TIMEOUT)]


def test_reservation_bound_job_is_stopped_when_its_reservation_ends() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    resv = reservation("R", ["n1-g0"], start_in=-100, end_in=0)
    run = [running("bound", ["n1-g0"], ends_in=500, reservation="R")]
    decisions = schedule(snapshot(fleet, [], run=run, reservations=[resv]), policy=FAIR, now=NOW)

    assert [(s.job_id, s.reason) for s in decisions.stops] == [("bound", StopReason.RESERVATION_ENDED)]


def test_invalid_job_is_explained_not_fatal() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    decisions = schedule(snapshot(fleet, [job("zero", gpus=0), job("ok")]), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["ok"]
    assert decisions.pending_reasons["zero"].code == ReasonCode.INVALID


def test_every_pending_job_that_did_not_start_has_a_reason() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    pending = [job(f"j{i}", gpus=1 + i % 2, submitted=NOW - i) for i in range(10)]
    for policy in (FIFO, BACKFILL, FAIR):
        decisions = schedule(snapshot(fleet, pending), policy=policy, now=NOW)
        started = {s.job_id for s in decisions.starts}
        assert started.isdisjoint(decisions.pending_reasons)
        assert started | set(decisions.pending_reasons) == {j.id for j in pending}
        if policy.backfill:
            assert decisions.considered == len(pending)
        else:
            assert 0 < decisions.considered <= len(pending)


def test_snapshot_rejects_duplicate_gpu_ids() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    try:
        schedule(Snapshot(gpus=(fleet[0], fleet[0]), pending=()), policy=FAIR, now=NOW)
    except ValueError as exc:
        assert "duplicate" in str(exc)
    else:
        raise AssertionError("duplicate GPU ids were accepted")


@pytest.mark.parametrize("bad", [{"size_weight_s": -1.0}, {"fairshare_weight_s": -1.0}, {"held_gpu_weight_s": -1.0}])
def test_negative_fair_weights_are_refused(bad: dict[str, float]) -> None:
    # A negative size or team term would turn the ageing bound around: the biggest job or the busiest team first.
    with pytest.raises(ValueError):
        Policy("fair", **bad)  # type: ignore[arg-type]
