"""The trace replay's CLI and simulator on a tiny hand-made trace, so a broken bench is caught by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.trace_replay import main

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
ROWS = [
    "p0,1000,1024,8,1000,,LS,Running,0,1000,0",  # 8 GPUs for 1000 s
    "p1,1000,1024,1,500,,BE,Succeeded,10,110,10",  # fractional: takes a whole GPU; waits for p0
    "p2,1000,1024,0,0,,BE,Succeeded,20,30,20",  # no GPU: skipped
    "p3,1000,1024,1,1000,,LS,Pending,30,40,",  # never scheduled: skipped
    "p4,1000,1024,1,1000,V100M32,BE,Succeeded,40,140,40",
]


@pytest.mark.parametrize("policy", ["fifo", "backfill", "fair"])
def test_replay_prints_the_metrics_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join([HEADER, *ROWS]) + "\n")
    assert main(["--pods", str(pods), "--gpus", "8", "--policy", policy, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)

    assert out["jobs"] == 3
    assert out["skipped"] == {"never_scheduled": 1, "no_gpu": 1, "no_fitting_node": 0}
    assert out["max_wait_s"] == pytest.approx(990.0)  # p1 (or p4) waits until p0 ends at 1000
    for key in ("mean_wait_s", "p50_wait_s", "p99_wait_s", "mean_jct_s", "gpu_allocation_ratio", "decisions_per_s"):
        assert key in out


def test_model_mix_honours_gpu_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join([HEADER, *ROWS]) + "\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,T4\nn1,1,1,8,T4\nn2,1,1,8,T4\nn3,1,1,8,V100M32\n")
    assert (
        main(["--pods", str(pods), "--nodes", str(nodes), "--model-mix", "--gpus", "8", "--policy", "fair", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)

    assert out["model_mix"] == {"T4": 6, "V100M32": 2}
    # p0 needs 8 GPUs on one node: no node of this 8-GPU mix has them.
    assert out["skipped"]["no_fitting_node"] == 1
    assert out["jobs"] == 2
    assert out["max_wait_s"] == 0.0


def test_node_size_and_the_mean_wait_by_task_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join([HEADER, *ROWS]) + "\n")
    assert main(["--pods", str(pods), "--gpus", "8", "--node-size", "4", "--policy", "fair", "--json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["node_size"] == 4
    assert small["skipped"]["no_fitting_node"] == 1  # p0's 8 GPUs do not fit on a 4-GPU node

    # Nodes of mixed sizes: the 8-GPU gang fits on the one 8-GPU node only.
    assert main(["--pods", str(pods), "--gpus", "12", "--node-shapes", "2,2,8", "--policy", "fair", "--json"]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert mixed["node_shapes"] == [2, 2, 8] and mixed["skipped"]["no_fitting_node"] == 0
    assert main(["--pods", str(pods), "--gpus", "12", "--node-shapes", "4,4,4", "--policy", "fair", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"]["no_fitting_node"] == 1
    with pytest.raises(SystemExit):
        main(["--pods", str(pods), "--gpus", "12", "--node-shapes", "2,2", "--policy", "fair"])

    assert main(["--pods", str(pods), "--gpus", "16", "--policy", "fair", "--sharing", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["mean_wait_by_size_s"]) == {"frac", "1", "8"}
    assert sum(out["mean_wait_by_size_s"].values()) == pytest.approx(out["mean_wait_s"], abs=0.2)


def test_the_long_work_rule_keeps_nodes_clear_for_gangs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    rows = [
        "long1,1,1,1,1000,,LS,Running,0,1000000,0",  # long one-GPU work opens n0
        "short7,1,1,7,1000,,LS,Succeeded,0,100,0",  # fills n0 for 100 s
        "long2,1,1,1,1000,,LS,Running,10,1000010,10",  # off: opens n1; on: waits for n0
        "gang1,1,1,8,1000,,BE,Succeeded,200,1200,200",
        "gang2,1,1,8,1000,,BE,Succeeded,200,1200,200",
    ]
    pods.write_text("\n".join([HEADER, *rows]) + "\n")
    args = ["--pods", str(pods), "--gpus", "24", "--policy", "fair", "--json"]
    assert main(args) == 0
    off = json.loads(capsys.readouterr().out)
    assert main([*args, "--gang-nodes-kept", "0.67", "--long-job-h", "24"]) == 0
    on = json.loads(capsys.readouterr().out)

    assert off["gang_nodes_kept"] == 0.0 and on["gang_nodes_kept"] == 0.67
    assert off["mean_wait_by_size_s"]["8"] == pytest.approx(1000 / 5)  # one gang waits for the other
    assert on["mean_wait_by_size_s"]["8"] == 0.0
    assert on["mean_wait_by_size_s"]["1"] == pytest.approx(90 / 5)  # long2 waited for room on n0
    # Each size's own waits: the gang that waited, and the one-GPU job that waited instead.
    assert off["waits_of_size"]["8"]["max_s"] == 1000 and on["waits_of_size"]["8"]["max_s"] == 0
    assert on["waits_of_size"]["1"]["max_s"] == 90 and on["waits_of_size"]["1"]["over_1d"] == 0
    assert sum(size["jobs"] for size in on["waits_of_size"].values()) == on["jobs"]
    with pytest.raises(SystemExit):
        main([*args, "--gang-nodes-kept", "1"])


def test_drop_unfinished_skips_the_tasks_still_running_at_the_trace_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = tmp_path / "pods.csv"
    # p5 is deleted at the trace's last timestamp (1000, like p0): its runtime is only a lower bound.
    pods.write_text("\n".join([HEADER, *ROWS, "p5,1000,1024,1,1000,,LS,Running,50,1000,50"]) + "\n")
    assert main(["--pods", str(pods), "--gpus", "8", "--policy", "fair", "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert kept["jobs"] == 4
    assert "unfinished" not in kept["skipped"]

    assert main(["--pods", str(pods), "--gpus", "8", "--policy", "fair", "--drop-unfinished", "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    # p0 and p5 both end at 1000, the trace's end; with p0 gone nothing waits for its 8 GPUs.
    assert dropped["drop_unfinished"] is True
    assert dropped["skipped"]["unfinished"] == 2
    assert dropped["jobs"] == 2
    assert dropped["max_wait_s"] == 0.0


def test_size_weight_sets_how_far_fair_favours_short_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    rows = [
        "blocker,1,1,1,1000,,LS,Succeeded,0,100,0",  # holds the one GPU until 100
        "big,1,1,1,1000,,LS,Succeeded,10,10100,100",  # 10,000 s, arrives first
        "small,1,1,1,1000,,LS,Succeeded,20,130,120",  # 10 s, arrives second
    ]
    pods.write_text("\n".join([HEADER, *rows]) + "\n")
    args = ["--pods", str(pods), "--gpus", "1", "--node-size", "1", "--policy", "fair", "--json"]
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*args, "--size-weight-h", "0"]) == 0
    arrival = json.loads(capsys.readouterr().out)

    assert default["size_weight_h"] == 24.0 and arrival["size_weight_h"] == 0.0
    # The portal's size term lets the short job go first when the GPU frees; without it, arrival order decides.
    assert default["max_wait_s"] == pytest.approx(100 - 10 + 10)  # big waits for blocker and small
    assert arrival["max_wait_s"] == pytest.approx(100 - 20 + 10_000)  # small waits behind big
    with pytest.raises(SystemExit):
        main([*args, "--size-weight-h", "-1"])
    with pytest.raises(SystemExit):
        main([*args[:-3], "--policy", "backfill", "--size-weight-h", "1", "--json"])
