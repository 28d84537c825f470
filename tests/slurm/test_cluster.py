"""The test cluster itself: fake GPUs are scheduled and accounted, associations are enforced."""

from __future__ import annotations

import pytest

from tests.support.slurm import Slurm, SlurmError


def test_gpu_job_runs_and_is_accounted(slurm: Slurm) -> None:
    slurm.add_account("smoke")
    job_id = slurm.run(
        "sbatch", "--parsable", "-A", "smoke", "--gres=gpu:a100:2", "-t", "1", "-o", "/dev/null", "--wrap", "true"
    ).stdout.strip()
    record = slurm.wait_job(job_id, {"COMPLETED", "FAILED"})
    assert record["state"] == {"current": "COMPLETED", "reason": "None"}
    gres = [t for t in record["tres"]["allocated"] if t["type"] == "gres" and t["name"] == "gpu"]  # type: ignore[index]
    assert gres and gres[0]["count"] == 2


def test_unknown_account_is_refused(slurm: Slurm) -> None:
    with pytest.raises(SlurmError, match=r"(?i)invalid account"):
        slurm.run("sbatch", "-A", "no-such-team", "-t", "1", "--wrap", "true")


def test_slurmctld_restart_keeps_the_node(slurm: Slurm) -> None:
    slurm.restart_slurmctld()
    out = slurm.run("scontrol", "show", "node", slurm.node).stdout
    assert f"Gres=gpu:{slurm.gpu_type}:{slurm.gpu_count}" in out
    job_id = slurm.run("sbatch", "--parsable", "-A", "smoke", "-t", "1", "-o", "/dev/null", "--wrap", "true").stdout
    assert slurm.wait_job(job_id.strip(), {"COMPLETED"})
