"""Usage from Slurm's accounting in the portal's ledger: a job submitted to Slurm directly under a team's account
is billed to that team once (the bridge sends its records again and again), a portal job is billed from its own
allocation, and the team's GPU-seconds in the ledger equal sacct's elapsed x allocated GPUs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from tests.conftest import LiveServer
from tests.slurm.bridge_procs import MODEL, BridgeStack, make_stack, running_stack
from tests.support.slurm import Slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(slurm: Slurm, live_portal: LiveServer, alice: Any, make_token: Any, tmp_path: Path) -> Iterator[BridgeStack]:
    yield from running_stack(make_stack(slurm, live_portal, alice, make_token, tmp_path))


def _sacct_gpu_seconds(slurm: Slurm, job_id: str) -> int:
    out = slurm.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "ElapsedRaw,AllocTRES").stdout.strip()
    elapsed, tres = out.split("|")
    gpus = int(dict(item.split("=", 1) for item in tres.split(","))["gres/gpu"])
    return int(elapsed) * gpus


def test_direct_and_portal_jobs_reconcile_to_sacct(stack: BridgeStack) -> None:
    from apps.billing.models import UsageRecord
    from apps.billing.services import ledger_close
    from apps.pools.models import ExternalJob

    slurm = stack.slurm
    direct = slurm.run("sbatch", "--parsable", "-A", "vision", "--gres=gpu:2", "-t", "1", "-o", "/dev/null",
                       "--wrap", "sleep 3").stdout.strip()  # fmt: skip
    job_id = stack.submit(["sleep", "2"], gpu_count=1)
    stack.wait_state(job_id, {"succeeded"})
    slurm.wait_job(direct, {"COMPLETED"})

    def direct_rows() -> int:
        return UsageRecord.objects.filter(source="slurm", source_id=int(direct)).count()

    stack.wait(lambda: direct_rows() == 2, 60, "the direct job's ledger rows (one per GPU)")
    portal_slurm_id = ExternalJob.objects.get(job_id=job_id).external_id
    ledger_close(now=timezone.now() + timedelta(hours=1))  # the beat task's run, past the close lag
    # The bridge keeps sending the same records: nothing is billed twice.
    before = UsageRecord.objects.count()
    time.sleep(5)  # two more syncs (every 2 s here)
    assert UsageRecord.objects.count() == before
    assert not UsageRecord.objects.filter(source="slurm", source_id=int(portal_slurm_id)).exists()
    ledger = UsageRecord.objects.filter(team__slug="vision").aggregate(s=Sum("gpu_seconds"))["s"]
    expected = _sacct_gpu_seconds(slurm, direct) + _sacct_gpu_seconds(slurm, portal_slurm_id)
    assert ledger == expected
    # The month's report (what managers read and export) carries the same GPU-hours.
    month = timezone.localtime().strftime("%Y-%m")
    resp = stack.api("GET", f"/api/v1/reports/monthly/?month={month}&team=vision")
    assert resp.status_code == 200, resp.text
    (team,) = resp.json()["teams"]
    assert Decimal(team["gpu_hours"]) == (Decimal(expected) / 3600).quantize(Decimal("0.001"))
    assert [m["gpu_model"] for m in team["by_gpu_model"]] == [MODEL]
