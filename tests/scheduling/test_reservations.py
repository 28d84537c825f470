"""Portal reservations: their GPUs are theirs inside the window, and bound jobs stay inside it."""

from __future__ import annotations

import pytest

from apps.jobs.scheduling import BACKFILL, FAIR, FIFO, Policy, ReasonCode, schedule
from tests.scheduling.builders import NOW, gpus, job, reservation, running, snapshot

FLEET = gpus({"n1": ("A100", 4), "n2": ("A100", 4)})
ACTIVE = reservation("R", ["n1-g0", "n1-g1"], start_in=-600, end_in=3600, team="vision")


@pytest.mark.parametrize("policy", [FIFO, BACKFILL, FAIR], ids=lambda p: p.name)
def test_active_reservation_gpus_are_only_for_jobs_bound_to_it(policy: Policy) -> None:
    fleet = gpus({"n1": ("A100", 2)})
    decisions = schedule(snapshot(fleet, [job("free-rider")], reservations=[ACTIVE]), policy=policy, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["free-rider"].code in {
        ReasonCode.HELD_BY_RESERVATION,
        ReasonCode.NEXT_IN_LINE,
        ReasonCode.WAITING_FOR_GPUS,
    }


def test_bound_job_runs_only_on_its_reservation_gpus() -> None:
    pending = [job("bound", gpus=2, duration=1800, reservation="R")]
    decisions = schedule(snapshot(FLEET, pending, reservations=[ACTIVE]), policy=FAIR, now=NOW)

    assert [(s.job_id, s.gpu_ids) for s in decisions.starts] == [("bound", ("n1-g0", "n1-g1"))]


def test_bound_job_waits_for_its_reservation_even_when_other_gpus_are_free() -> None:
    run = [running("mine", ["n1-g0"], ends_in=300, reservation="R")]
    pending = [job("bound", gpus=2, duration=1800, reservation="R")]
    decisions = schedule(snapshot(FLEET, pending, run=run, reservations=[ACTIVE]), policy=FAIR, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["bound"].code == ReasonCode.WAITING_FOR_RESERVED_GPUS


def test_bound_job_does_not_start_before_its_window() -> None:
    later = reservation("L", ["n2-g0"], start_in=600, end_in=7200)
    decisions = schedule(snapshot(FLEET, [job("early", reservation="L")], reservations=[later]), policy=FAIR, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["early"].code == ReasonCode.RESERVATION_NOT_STARTED


def test_bound_job_must_end_by_the_reservation_end() -> None:
    pending = [job("too-long", duration=3601, reservation="R"), job("just-fits", duration=3600, reservation="R")]
    decisions = schedule(snapshot(FLEET, pending, reservations=[ACTIVE]), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["just-fits"]
    assert decisions.starts[0].expected_end == ACTIVE.end
    assert decisions.pending_reasons["too-long"].code == ReasonCode.OUTSIDE_RESERVATION_WINDOW


def test_bound_job_of_another_team_is_refused() -> None:
    pending = [job("intruder", team="nlp", reservation="R")]
    decisions = schedule(snapshot(FLEET, pending, reservations=[ACTIVE]), policy=FAIR, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["intruder"].code == ReasonCode.RESERVATION_OTHER_TEAM


def test_bound_job_of_an_unknown_or_ended_reservation_waits_with_a_reason() -> None:
    ended = reservation("E", ["n2-g0"], start_in=-7200, end_in=-1)
    pending = [job("gone", reservation="E"), job("never", reservation="nope")]
    decisions = schedule(snapshot(FLEET, pending, reservations=[ended]), policy=FAIR, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["gone"].code == ReasonCode.RESERVATION_UNKNOWN
    assert decisions.pending_reasons["never"].code == ReasonCode.RESERVATION_UNKNOWN


def test_bound_gang_must_fit_on_one_node_of_the_reservation() -> None:
    split = reservation("S", ["n1-g0", "n1-g1", "n2-g0", "n2-g1"], start_in=-10, end_in=7200)
    pending = [job("three", gpus=3, reservation="S"), job("two", gpus=2, reservation="S")]
    decisions = schedule(snapshot(FLEET, pending, reservations=[split]), policy=FAIR, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["two"]
    assert decisions.pending_reasons["three"].code == ReasonCode.GANG_DOES_NOT_FIT


def test_unbound_job_uses_gpus_reserved_later_only_if_it_ends_before_the_reservation() -> None:
    fleet = gpus({"n1": ("A100", 1)})
    later = reservation("L", ["n1-g0"], start_in=1000, end_in=2000, team="nlp")
    for duration, should_start in [(1000, True), (1001, False)]:
        decisions = schedule(snapshot(fleet, [job("j", duration=duration)], reservations=[later]), policy=FAIR, now=NOW)
        assert bool(decisions.starts) is should_start


def test_fifo_head_may_use_gpus_reserved_later_if_it_ends_in_time() -> None:
    fleet = gpus({"n1": ("A100", 2)})
    later = reservation("L", ["n1-g0", "n1-g1"], start_in=1000, end_in=2000, team="nlp")
    decisions = schedule(
        snapshot(fleet, [job("short", gpus=2, duration=900)], reservations=[later]), policy=FIFO, now=NOW
    )

    assert [s.job_id for s in decisions.starts] == ["short"]


def test_bound_jobs_do_not_block_the_fifo_queue() -> None:
    fleet = gpus({"n1": ("A100", 2), "n2": ("A100", 2)})
    resv = reservation("R", ["n1-g0", "n1-g1"], start_in=-10, end_in=100, team="vision")
    pending = [job("bound-too-long", duration=500, reservation="R", submitted=NOW - 50), job("general")]
    decisions = schedule(snapshot(fleet, pending, reservations=[resv]), policy=FIFO, now=NOW)

    assert [(s.job_id, s.node) for s in decisions.starts] == [("general", "n2")]
