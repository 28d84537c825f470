"""The bridge's Slurm readers on a real cluster: the JSON path (21.08+) and the text path (older Slurm, or
SLURM_BRIDGE_TEXT=1) read the same nodes, queue entries and accounting records; exit codes come from the text
accounting before 23.02 (its sacct --json says SUCCESS/0 for every job)."""

from __future__ import annotations

import pytest

from tests.support.slurm import Slurm
from workers.slurm_bridge.slurm import Slurm as Commands
from workers.slurm_bridge.slurm import batch_script, expand_indexes, parse_gres, parse_tres


def test_pure_parsers() -> None:
    assert expand_indexes("0-2,5") == [0, 1, 2, 5]
    assert parse_gres("gpu:a100:4(S:0),gpu:2,mps:100") == [("a100", 4), ("gpu", 2)]
    assert parse_tres("cpu=1,mem=100M,gres/gpu=2")["gres/gpu"] == 2
    assert batch_script(["echo", "a b", "$HOME; rm -rf /"], {"X": "it's"}) == (
        "#!/bin/sh\nexport X='it'\"'\"'s'\nexec echo 'a b' '$HOME; rm -rf /'\n"
    )


@pytest.mark.parametrize("text", [False, True], ids=["json", "text"])
def test_readers_agree(slurm: Slurm, text: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if text:
        monkeypatch.setenv("SLURM_BRIDGE_TEXT", "1")
    slurm.add_account("readers")
    commands = Commands(partition=slurm.partition, env=slurm.env)
    assert commands.json is not text
    (node,) = commands.nodes()
    assert (node.name, node.up, list(node.gpus)) == (slurm.node, True, [(slurm.gpu_type, slurm.gpu_count)])
    job_id = commands.submit(
        script=batch_script(["sh", "-c", "exit 7"], {}), account="readers", gres="gpu:a100:2", minutes=1,
        comment="portal-job-424242", output="/dev/null", name="readers", cpus=1, memory_mib=100,
    )  # fmt: skip
    slurm.wait_job(job_id, {"FAILED"})
    queued = commands.queue()[job_id]
    assert (queued.comment, queued.account) == ("portal-job-424242", "readers")
    record = commands.accounting([job_id])[job_id]
    assert (record.state, record.exit_code, record.alloc_tres["gres/gpu"]) == ("FAILED", 7, 2)
    assert record.start_time and record.end_time and record.end_time >= record.start_time


def test_hostlists_are_expanded_by_slurm(slurm: Slurm) -> None:
    """Reservations show their nodes as a hostlist; the bridge compares them with the booking's node names."""
    commands = Commands(partition=slurm.partition, env=slurm.env)
    assert commands.hostnames("gpu-[08-10],cpu-[1,3]") == ("gpu-08", "gpu-09", "gpu-10", "cpu-1", "cpu-3")
    assert commands.hostnames("gpu-sim-1") == ("gpu-sim-1",)
    assert commands.hostnames("") == ()
