"""Gang placement: one node per job, best fit, model constraints."""

from __future__ import annotations

from apps.jobs.scheduling import BACKFILL, FIFO, Gpu, ReasonCode, schedule
from tests.scheduling.builders import NOW, gpus, job, running, snapshot


def _node_of(gpu_id: str) -> str:
    return gpu_id.rsplit("-g", 1)[0]


def test_multi_gpu_job_waits_rather_than_spanning_nodes() -> None:
    fleet = gpus({"n1": ("A100", 4), "n2": ("A100", 4)})
    run = [running("r1", ["n1-g0", "n1-g1"], ends_in=600), running("r2", ["n2-g0", "n2-g1"], ends_in=600)]
    decisions = schedule(snapshot(fleet, [job("big", gpus=4)], run=run), policy=BACKFILL, now=NOW)

    assert decisions.starts == ()
    assert decisions.pending_reasons["big"].code in {ReasonCode.NEXT_IN_LINE, ReasonCode.WAITING_FOR_GPUS}
    assert decisions.planned is not None
    assert decisions.planned.start == NOW + 600


def test_multi_gpu_job_gets_all_gpus_on_one_node() -> None:
    fleet = gpus({"n1": ("A100", 4), "n2": ("A100", 4)})
    decisions = schedule(snapshot(fleet, [job("a", gpus=3), job("b", gpus=3)]), policy=FIFO, now=NOW)

    assert len(decisions.starts) == 2
    for start in decisions.starts:
        assert len(start.gpu_ids) == 3
        assert {_node_of(g) for g in start.gpu_ids} == {start.node}
    assert decisions.starts[0].node != decisions.starts[1].node


def test_gang_bigger_than_any_node_is_refused_with_a_reason_and_does_not_block() -> None:
    fleet = gpus({"n1": ("A100", 8), "n2": ("A100", 8)})
    pending = [job("huge", gpus=16, submitted=NOW - 500), job("small", gpus=1, submitted=NOW - 10)]
    decisions = schedule(snapshot(fleet, pending), policy=FIFO, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["small"]
    assert decisions.pending_reasons["huge"].code == ReasonCode.GANG_DOES_NOT_FIT


def test_best_fit_keeps_a_whole_node_free_for_a_big_job() -> None:
    fleet = gpus({"a": ("A100", 8), "b": ("A100", 8), "c": ("A100", 8)})
    # b has 3 free GPUs, c has 6: the 2-GPU job must go to b (1 left), not to a whole node or to c.
    run = [
        running("rb", [f"b-g{i}" for i in range(5)], ends_in=3600),
        running("rc", ["c-g0", "c-g1"], ends_in=3600),
    ]
    pending = [job("two", gpus=2, submitted=NOW - 30), job("eight", gpus=8, submitted=NOW - 20)]
    decisions = schedule(snapshot(fleet, pending, run=run), policy=FIFO, now=NOW)

    placed = {s.job_id: s for s in decisions.starts}
    assert placed["two"].node == "b"
    assert placed["eight"].node == "a"


def test_best_fit_prefers_exact_fit_over_a_larger_hole() -> None:
    fleet = gpus({"a": ("A100", 8), "b": ("A100", 8)})
    run = [running("ra", [f"a-g{i}" for i in range(4)], ends_in=3600), running("rb", ["b-g0"], ends_in=3600)]
    decisions = schedule(snapshot(fleet, [job("four", gpus=4)], run=run), policy=FIFO, now=NOW)

    assert decisions.starts[0].node == "a"


def test_model_constraint_places_only_on_acceptable_models() -> None:
    fleet = gpus({"t4": ("T4", 8), "v16": ("V100M16", 2), "v32": ("V100M32", 4)})
    pending = [
        job("v100", gpus=3, models={"V100M16", "V100M32"}, submitted=NOW - 30),
        job("v16", gpus=2, models={"V100M16"}, submitted=NOW - 20),
        job("any", gpus=8, submitted=NOW - 10),
    ]
    decisions = schedule(snapshot(fleet, pending), policy=FIFO, now=NOW)

    placed = {s.job_id: s.node for s in decisions.starts}
    assert placed == {"v100": "v32", "v16": "v16", "any": "t4"}


def test_model_constraint_waits_when_only_other_models_are_free() -> None:
    fleet = gpus({"t4": ("T4", 8), "v32": ("V100M32", 4)})
    run = [running("r", [f"v32-g{i}" for i in range(4)], ends_in=600)]
    decisions = schedule(snapshot(fleet, [job("v", models={"V100M32"})], run=run), policy=BACKFILL, now=NOW)

    assert decisions.starts == ()
    assert decisions.planned is not None and decisions.planned.node == "v32"


def test_model_absent_from_fleet_is_explained() -> None:
    fleet = gpus({"t4": ("T4", 8)})
    decisions = schedule(snapshot(fleet, [job("h", models={"H100"})]), policy=FIFO, now=NOW)

    assert decisions.starts == ()
    reason = decisions.pending_reasons["h"]
    assert reason.code == ReasonCode.GANG_DOES_NOT_FIT
    assert "H100" in reason.message


def test_partly_used_gpu_is_not_free_for_a_whole_gpu_job() -> None:
    fleet = [Gpu("n-g0", "n", "A100", 1.0, 0.5), Gpu("n-g1", "n", "A100", 1.0, 1.0)]
    decisions = schedule(snapshot(fleet, [job("a"), job("b", submitted=NOW - 50)]), policy=BACKFILL, now=NOW)

    assert [(s.job_id, s.gpu_ids) for s in decisions.starts] == [("a", ("n-g1",))]
    # The half-used GPU has no known end, so b is planned after a, on a's GPU.
    assert decisions.planned is not None
    assert (decisions.planned.job_id, decisions.planned.gpu_ids) == ("b", ("n-g1",))
    assert decisions.planned.start == NOW + 3600


def test_mixed_model_node_serves_a_job_that_accepts_both_models() -> None:
    fleet = [Gpu("m-g0", "m", "V100M16"), Gpu("m-g1", "m", "V100M32"), Gpu("m-g2", "m", "V100M32")]
    pending = [job("both", gpus=2, models={"V100M16", "V100M32"}), job("only16", gpus=2, models={"V100M16"})]
    decisions = schedule(snapshot(fleet, pending), policy=BACKFILL, now=NOW)

    assert [s.job_id for s in decisions.starts] == ["both"]
    assert decisions.pending_reasons["only16"].code == ReasonCode.GANG_DOES_NOT_FIT


def test_a_node_gives_its_gpus_nothing_outside_the_portal_uses_first_and_the_others_when_needed() -> None:
    from dataclasses import replace

    fleet = [
        replace(g, in_use_outside=g.id in {"n1-g0", "n1-g1"}, split=g.id == "n1-g3") for g in gpus({"n1": ("A100", 4)})
    ]
    one = schedule(snapshot(fleet, [job("a", gpus=1)]), policy=FIFO, now=NOW)
    assert [s.gpu_ids for s in one.starts] == [("n1-g2",)]
    # Used GPUs before a split one (a split GPU is kept for shares), and a job that needs them all gets them all.
    three = schedule(snapshot(fleet, [job("b", gpus=3)]), policy=FIFO, now=NOW)
    assert [sorted(s.gpu_ids) for s in three.starts] == [["n1-g0", "n1-g1", "n1-g2"]]
    four = schedule(snapshot(fleet, [job("c", gpus=4)]), policy=FIFO, now=NOW)
    assert [sorted(s.gpu_ids) for s in four.starts] == [["n1-g0", "n1-g1", "n1-g2", "n1-g3"]]
