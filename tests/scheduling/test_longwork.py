"""Long work that leaves part of a node goes where long work already is (apps.jobs.scheduling.longwork)."""

from __future__ import annotations

import dataclasses

import pytest

from apps.jobs.scheduling import FAIR, Policy, ReasonCode, schedule
from apps.jobs.scheduling.model import Gpu, RunningJob
from tests.scheduling.builders import NOW, gpus, job, running, snapshot

DAY = 86400.0
KEEP = dataclasses.replace(FAIR, gang_nodes_kept=1 / 3, long_job_s=DAY, long_job_patience_s=3600.0)


def _fleet(nodes: int = 3) -> list[Gpu]:
    return gpus({f"n{i}": ("A100", 8) for i in range(1, nodes + 1)})


def _held_by_long_work() -> list[RunningJob]:
    # n1: one GPU held for ten more days; n2: six GPUs held for an hour (best fit's favourite for one GPU).
    return [
        running("long-1", ["n1-g0"], ends_in=10 * DAY),
        running("short-2", [f"n2-g{i}" for i in range(6)], ends_in=3600),
    ]


def test_a_long_job_goes_where_long_work_already_is_not_where_best_fit_would_put_it() -> None:
    pending = [job("long", duration=3 * DAY, submitted=NOW - 60), job("short", duration=600, submitted=NOW - 30)]
    decisions = schedule(snapshot(_fleet(), pending, run=_held_by_long_work()), policy=KEEP, now=NOW)

    nodes = {s.job_id: s.node for s in decisions.starts}
    assert nodes == {"long": "n1", "short": "n2"}


def test_the_rule_is_off_by_default_and_best_fit_decides() -> None:
    pending = [job("long", duration=3 * DAY, submitted=NOW - 60)]
    decisions = schedule(snapshot(_fleet(), pending, run=_held_by_long_work()), policy=FAIR, now=NOW)

    assert [(s.job_id, s.node) for s in decisions.starts] == [("long", "n2")]


def test_long_work_opens_a_clear_node_only_while_more_than_the_kept_share_stays_clear() -> None:
    # n1 is full: long work there, short work on the rest. n2 and n3 are clear; a third of 3 nodes is 1 kept.
    run = [running("long-1", ["n1-g0"], ends_in=10 * DAY)]
    run.append(running("short-1", [f"n1-g{i}" for i in range(1, 8)], ends_in=3600))
    pending = [
        job("long-a", gpus=6, duration=3 * DAY, submitted=NOW - 60),
        job("long-b", duration=3 * DAY, submitted=NOW - 55),
        job("long-c", gpus=2, duration=3 * DAY, submitted=NOW - 50),
    ]
    decisions = schedule(snapshot(_fleet(), pending, run=run), policy=KEEP, now=NOW)

    # Fair order puts the small ones first: long-b opens a clear node, long-c joins it there.
    nodes = {s.job_id: s.node for s in decisions.starts}
    assert set(nodes) == {"long-b", "long-c"}
    opened = nodes["long-b"]
    assert opened in {"n2", "n3"}
    assert nodes["long-c"] == opened
    # long-a (6 GPUs) may not open the last clear node: it waits for room where long work is.
    assert decisions.pending_reasons["long-a"].code == ReasonCode.NEXT_IN_LINE
    assert decisions.planned is not None and decisions.planned.job_id == "long-a"
    assert decisions.planned.node in {"n1", opened}


def test_a_long_job_that_waited_its_patience_takes_any_node() -> None:
    run = [running("long-1", ["n1-g0"], ends_in=10 * DAY)]
    run.append(running("short-1", [f"n1-g{i}" for i in range(1, 8)], ends_in=3600))
    run.append(running("long-2", ["n2-g0"], ends_in=10 * DAY))
    run.append(running("short-2", [f"n2-g{i}" for i in range(1, 8)], ends_in=3600))
    fresh = job("fresh", duration=3 * DAY, submitted=NOW - 60)
    patient = job("patient", duration=3 * DAY, submitted=NOW - 2 * 3600)

    assert schedule(snapshot(_fleet(), [fresh], run=run), policy=KEEP, now=NOW).starts == ()
    started = schedule(snapshot(_fleet(), [patient], run=run), policy=KEEP, now=NOW).starts
    assert [(s.job_id, s.node) for s in started] == [("patient", "n3")]


def test_short_jobs_and_whole_node_gangs_are_not_held_back() -> None:
    run = [running("long-1", ["n1-g0"], ends_in=10 * DAY), running("long-2", ["n2-g0"], ends_in=10 * DAY)]
    pending = [
        job("gang", gpus=8, duration=3 * DAY, submitted=NOW - 60),
        job("short", duration=600, submitted=NOW - 30),
    ]
    decisions = schedule(snapshot(_fleet(), pending, run=run), policy=KEEP, now=NOW)

    nodes = {s.job_id: s.node for s in decisions.starts}
    assert nodes["gang"] == "n3"
    assert nodes["short"] in {"n1", "n2"}


def test_a_long_fraction_of_a_gpu_counts_as_long_work() -> None:
    fleet = _fleet()
    run = [running("long-1", ["n1-g0"], ends_in=10 * DAY), running("long-2", ["n2-g0"], ends_in=10 * DAY)]
    run.append(running("short-1", [f"n1-g{i}" for i in range(1, 8)], ends_in=3600))
    run.append(running("short-2", [f"n2-g{i}" for i in range(1, 8)], ends_in=3600))
    # n3-g0 is a quarter used by a short job: best fit would put the fraction there, on the last clear node.
    shared = [Gpu(g.id, g.node, g.model, 1.0, 0.75) if g.id == "n3-g0" else g for g in fleet]
    quarter = dataclasses.replace(job("quarter", duration=3 * DAY, submitted=NOW - 60), gpu_milli=250)
    snap = snapshot(shared, [quarter], run=run)

    assert schedule(snap, policy=KEEP, now=NOW).starts == ()
    assert [s.node for s in schedule(snap, policy=FAIR, now=NOW).starts] == ["n3"]


def test_a_fleet_of_two_multi_gpu_nodes_keeps_none() -> None:
    run = [running("long-1", ["n1-g0"], ends_in=10 * DAY)]
    run.append(running("short-1", [f"n1-g{i}" for i in range(1, 8)], ends_in=3600))
    decisions = schedule(snapshot(_fleet(2), [job("long", duration=3 * DAY)], run=run), policy=KEEP, now=NOW)

    assert [s.node for s in decisions.starts] == ["n2"]


@pytest.mark.parametrize(
    "bad",
    [{"gang_nodes_kept": 1.0}, {"gang_nodes_kept": -0.1}, {"long_job_s": -1.0}, {"long_job_patience_s": -1.0}],
)
def test_impossible_knobs_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Policy("fair", **bad)  # type: ignore[arg-type]
