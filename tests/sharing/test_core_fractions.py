"""The scheduling core's placement of fractional jobs (apps.jobs.scheduling.placement.ShareState), pure: a
fraction fills a GPU that is already shared before it opens a whole one, opens one on the node with the fewest
whole GPUs free, leaves whole nodes to gangs, respects the backfill shadow; and the trace replay's --sharing."""

from __future__ import annotations

import dataclasses

from apps.jobs.scheduling import BACKFILL, FAIR, Gpu, ReasonCode, RunningJob, Snapshot, schedule
from bench.trace_replay import TraceTask, replay
from tests.scheduling.builders import NOW, gpus, job


def frac(job_id: str, milli: int, **kw: object) -> object:
    return dataclasses.replace(job(job_id, **kw), gpu_milli=milli)  # type: ignore[arg-type]


def _starts(snapshot: Snapshot, policy: object = FAIR) -> dict[str, tuple[str, ...]]:
    decisions = schedule(snapshot, policy=policy, now=NOW)  # type: ignore[arg-type]
    return {s.job_id: s.gpu_ids for s in decisions.starts}


def test_a_fraction_goes_to_a_shared_gpu_before_a_whole_one():
    cluster = gpus({"a": ("A100", 4), "b": ("A100", 4)})
    cluster[5] = Gpu(cluster[5].id, "b", "A100", 1.0, 0.5)  # b-g1 half used
    running = (RunningJob("r", "vision", ("b-g1",), NOW - 10, 3600),)
    starts = _starts(Snapshot(gpus=tuple(cluster), pending=(frac("q", 250),), running=running))
    assert starts == {"q": ("b-g1",)}


def test_fractions_pack_one_gpu_then_open_one_on_the_fullest_node():
    cluster = gpus({"a": ("A100", 4), "b": ("A100", 2)})
    pending = tuple(frac(f"h{i}", 500, submitted=NOW - 100 + i) for i in range(3))
    starts = _starts(Snapshot(gpus=tuple(cluster), pending=pending), BACKFILL)
    assert starts["h0"] == starts["h1"]  # two halves share one GPU
    assert starts["h2"] != starts["h0"]
    assert {g[0].split("-")[0] for g in starts.values()} == {"b"}  # node b: fewest whole GPUs free
    # The untouched node is still whole for a 4-GPU gang.
    decisions = schedule(
        Snapshot(gpus=tuple(cluster), pending=(*pending, job("gang", gpus=4))), policy=BACKFILL, now=NOW
    )
    gang = [s for s in decisions.starts if s.job_id == "gang"]
    assert gang and {g.split("-")[0] for g in gang[0].gpu_ids} == {"a"}
    assert {s.milli for s in decisions.starts} == {500, 1000}


def test_a_fraction_of_several_gpus_is_invalid():
    snapshot = Snapshot(gpus=tuple(gpus({"a": ("A100", 2)})), pending=(frac("bad", 500, gpus=2),))
    decisions = schedule(snapshot, policy=FAIR, now=NOW)
    assert decisions.pending_reasons["bad"].code == ReasonCode.INVALID


def test_a_fraction_does_not_delay_the_planned_gang():
    """One GPU of two is half used until NOW+1000; a 2-GPU gang waits for it (planned start). A fraction that
    would hold that GPU past NOW+1000 must not start there, one that ends before may."""
    cluster = list(gpus({"a": ("A100", 2)}))
    cluster[0] = Gpu("a-g0", "a", "A100", 1.0, 0.5)
    running = (RunningJob("r", "vision", ("a-g0",), NOW - 10, 1010),)
    long = frac("long", 250, duration=5000, submitted=NOW - 50)
    short = frac("short", 250, duration=500, submitted=NOW - 40)
    gang = job("gang", gpus=2, submitted=NOW - 100)
    starts = _starts(Snapshot(gpus=tuple(cluster), pending=(gang, long, short), running=running), BACKFILL)
    assert "gang" not in starts and "long" not in starts
    assert starts.get("short") == ("a-g0",)


def test_replay_with_sharing_runs_quarters_side_by_side():
    tasks = [TraceTask(f"t{i}", "LS", 0.0, 100.0, 1, None, 250) for i in range(4)]
    one_gpu = [Gpu("n-g0", "n", "GPU")]
    whole = replay(tasks, one_gpu, FAIR)
    shared = replay(tasks, one_gpu, FAIR, sharing=True)
    assert whole["mean_wait_s"] == 150.0  # 0, 100, 200, 300
    assert shared["mean_wait_s"] == 0.0
    assert (whole["mean_jct_s"], shared["mean_jct_s"]) == (250.0, 100.0)


def _split(cluster: list[Gpu], *ids: str) -> list[Gpu]:
    return [dataclasses.replace(g, split=True) if g.id in ids else g for g in cluster]


def test_a_whole_gpu_job_takes_exclusive_gpus_anywhere_before_a_gpu_split_in_shares():
    # Node a has one free GPU, split in shares: best fit alone would choose it (the fullest node).
    cluster = _split(gpus({"a": ("A100", 1), "b": ("A100", 2)}), "a-g0")
    assert _starts(Snapshot(gpus=tuple(cluster), pending=(job("one"),))) == {"one": ("b-g0",)}
    # Two one-GPU jobs and a third: the exclusive ones first, then the split one.
    pending = tuple(job(f"j{i}", submitted=NOW - 100 + i) for i in range(3))
    starts = _starts(Snapshot(gpus=tuple(cluster), pending=pending))
    assert sorted(starts.values()) == [("a-g0",), ("b-g0",), ("b-g1",)]
    assert starts["j2"] == ("a-g0",)


def test_a_gang_takes_a_split_gpu_only_where_no_node_has_enough_exclusive_ones():
    cluster = _split(gpus({"a": ("A100", 2), "b": ("A100", 3)}), "a-g1", "b-g2")
    # Node a has one exclusive and one split GPU, node b two exclusive and one split: the pair goes on b's two.
    assert _starts(Snapshot(gpus=tuple(cluster), pending=(job("pair", gpus=2),))) == {"pair": ("b-g0", "b-g1")}
    # Three GPUs fit only on b, with its split one last.
    assert _starts(Snapshot(gpus=tuple(cluster), pending=(job("three", gpus=3),))) == {
        "three": ("b-g0", "b-g1", "b-g2")
    }
