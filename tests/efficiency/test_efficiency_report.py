"""GET /api/v1/reports/efficiency/ (JSON and CSV), the Efficiency page and the PDF section, over real ledger rows
and reclaim records: allocated, utilization-weighted, idle and reclaimed GPU-hours per team and user, the worst."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.billing import pdf
from apps.billing.models import UsageRecord
from apps.billing.selectors import monthly_report
from apps.billing.selectors.months import current_month
from apps.efficiency.models import IdleMark, MarkState
from apps.efficiency.report import pdf_lines
from apps.jobs.models import Job, JobState
from tests.efficiency.conftest import write_minutes
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

pytestmark = pytest.mark.django_db
URL = "/api/v1/reports/efficiency/"


@pytest.fixture
def ledger(alice: Any, bob: Any, vision: Any) -> None:
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.0"))
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, model=model, uuid="GPU-r-0")
    start = timezone.localtime().replace(day=1, hour=1, minute=0, second=0, microsecond=0)
    month = start.date()

    def row(user: Any, source: str, sid: int, hours: int, util: str | None, offset_h: int) -> None:
        s = start + timedelta(hours=offset_h)
        UsageRecord.objects.create(
            team=vision, user=user, gpu=gpu, gpu_model=model, source=source, source_id=sid, start=s,
            end=s + timedelta(hours=hours), day=s.date(), month=month, gpu_seconds=hours * 3600,
            hourly_price=Decimal("2.0"), cost=Decimal(hours * 2),
            mean_utilization=Decimal(util) if util is not None else None,
        )  # fmt: skip

    row(alice, "reservation", 11, 10, "0.10", 0)  # 10 h, 1 used, 9 idle: 18.00 idle cost
    row(bob, "job", 12, 4, "0.75", 10)  # 4 h, 3 used, 1 idle: 2.00
    row(bob, "job", 13, 2, None, 14)  # no telemetry: counts in neither used nor idle
    job = Job.objects.create(
        team=vision, user=bob, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=3600, state=JobState.SUCCEEDED, started_at=start, ended_at=start + timedelta(minutes=10),
    )  # fmt: skip
    job.gpus.set([gpu])
    write_minutes(gpu, start, 10, util=50, mem=20480)  # a quarter of the A100's memory at its peak
    IdleMark.objects.create(
        team=vision, user=alice, kind="reservation", source_id=11, state=MarkState.RECLAIMED,
        reclaimed_at=timezone.now(), reclaimed_gpu_hours=Decimal("5.5"), reclaimed_cost=Decimal("11"),
    )  # fmt: skip


def test_manager_gets_the_figures(api_as, alice, ledger):
    body = api_as(alice).get(URL, {"team": "vision"}).json()
    [team] = body["teams"]
    assert (team["allocated_gpu_hours"], team["used_gpu_hours"], team["idle_gpu_hours"], team["idle_cost"]) == (
        "16.00",
        "4.00",
        "10.00",
        "20.00",
    )
    assert team["reclaimed_gpu_hours"] == "5.50" and team["reclaimed_cost"] == "11.00"
    users = {u["user"]: u for u in team["by_user"]}
    assert users["alice"]["idle_gpu_hours"] == "9.00" and users["alice"]["reclaimed_gpu_hours"] == "5.50"
    assert users["bob"]["used_gpu_hours"] == "3.00" and users["bob"]["allocated_gpu_hours"] == "6.00"
    assert [(w["kind"], w["id"]) for w in team["worst"]] == [("reservation", 11), ("job", 12)]
    assert (team["memory_peak_pct"], team["jobs_measured"]) == ("25.0", 1)
    assert (users["bob"]["memory_peak_pct"], users["alice"]["memory_peak_pct"]) == ("25.0", None)
    assert body["totals"]["idle_cost"] == "20.00"


def test_members_are_refused_outsiders_get_404(api_as, bob, charlie, ledger):
    assert api_as(bob).get(URL, {"team": "vision"}).status_code == 403
    assert api_as(charlie).get(URL, {"team": "vision"}).status_code == 404
    resp = api_as(bob).get(URL, {"month": "2026-13"})
    assert resp.status_code == 400 and resp.json()["code"] == "invalid"


def test_csv(api_as, alice, ledger):
    resp = api_as(alice).get(URL, {"team": "vision", "format": "csv"})
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(resp.content.decode())))
    assert rows[0][:5] == ["month", "scope", "team", "user", "item"]
    team_row = next(r for r in rows if r[1] == "team")
    assert team_row[5:9] == ["16.00", "4.00", "10.00", "20.00"]
    assert any(r[1] == "worst" and r[4] == "reservation:11" for r in rows)


def test_page_and_pdf_section(alice, bob, ledger):
    client = Client()
    client.force_login(alice)
    page = client.get("/efficiency/").content.decode()
    assert 'id="chart-efficiency-teams"' in page and 'id="efficiency-data"' in page and "20.00" in page
    client.force_login(bob)
    assert 'id="efficiency-error"' in client.get("/efficiency/").content.decode()
    report = monthly_report(user=alice, month=current_month(), team_slug="vision")
    data = pdf.team_statement(report, "vision")
    assert data.startswith(b"%PDF")
    lines = pdf_lines(team_slug="vision", month=current_month())
    assert lines[0].startswith("16.00 GPU-hours allocated, 4.00 used") and "5.50 GPU-hours" in lines[1]
    assert lines[2].startswith("Most idle: reservation #11: 9.00 idle GPU-hours")


def test_each_job_is_measured_in_its_own_run_on_its_own_memory(api_as, alice, bob, vision, ledger):
    """Two jobs on one GPU at different times each get their own minutes' peak (not the GPU's over both runs), and
    a job on a MIG instance is measured by its own processes' peak against the instance's memory."""
    from apps.fleet.devices import MigInstance, mig_layout_apply
    from apps.fleet.models import Gpu

    gpu = Gpu.objects.get(uuid="GPU-r-0")
    start = timezone.localtime().replace(day=1, hour=1, minute=0, second=0, microsecond=0) + timedelta(hours=2)
    later = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=3600, state=JobState.SUCCEEDED, started_at=start, ended_at=start + timedelta(minutes=10),
    )  # fmt: skip
    later.gpus.set([gpu])
    write_minutes(gpu, start, 10, util=50, mem=40960)  # half the A100's memory, two hours after bob's job
    mig = GpuFactory(node=gpu.node, index=1, model=gpu.model, uuid="GPU-r-1", mig_mode=True)
    mig_layout_apply(gpu=mig, mig_mode=True, instances=[MigInstance("MIG-r-1", "1g.10gb", 9_728, 7)])
    part = Gpu.devices.get(uuid="MIG-r-1")
    on_part = Job.objects.create(
        team=vision, user=alice, image="x", command=["true"], gpu_count=1, cpus=Decimal(1), memory_mib=1024,
        max_duration_s=3600, state=JobState.SUCCEEDED, started_at=start, ended_at=start + timedelta(minutes=10),
        mig_profile="1g.10gb", gpu_memory_own_peak_mib=7_296,
    )  # fmt: skip
    on_part.gpus.set([part])
    write_minutes(mig, start, 10, util=90, mem=80_000)  # the whole GPU: other instances' memory, not the job's
    body = api_as(alice).get(URL, {"team": "vision"}).json()
    [team] = body["teams"]
    users = {u["user"]: u for u in team["by_user"]}
    assert (users["bob"]["memory_peak_pct"], users["bob"]["jobs_measured"]) == ("25.0", 1)
    # 50% on the whole GPU and 75% of the instance's 9,728 MiB.
    assert (users["alice"]["memory_peak_pct"], users["alice"]["jobs_measured"]) == ("62.5", 2)
    assert (team["memory_peak_pct"], team["jobs_measured"]) == ("50.0", 3)


def test_totals_are_the_rounded_sum_as_on_the_costs_page(api_as, admin, alice, vision, nlp):
    """Two teams idle for 0.004 each: each shows 0.00, and the fleet's total is 0.01 on both reports (the sum of
    the rounded figures would say 0.00 here and 0.01 on the Costs page). Hours without telemetry are counted."""
    model = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.0"))
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, model=model, uuid="GPU-t-0")
    start = timezone.localtime().replace(day=1, hour=1, minute=0, second=0, microsecond=0)
    for i, (team, util) in enumerate([(vision, "0"), (nlp, "0"), (nlp, None)]):
        s = start + timedelta(hours=i)
        UsageRecord.objects.create(
            team=team, user=alice, gpu=gpu, gpu_model=model, source="reservation", source_id=i + 1, start=s,
            end=s + timedelta(hours=1), day=s.date(), month=start.date(), gpu_seconds=3600,
            hourly_price=Decimal("0.004"), cost=Decimal("0.004"),
            mean_utilization=Decimal(util) if util is not None else None,
        )  # fmt: skip
    body = api_as(admin).get(URL).json()
    assert [t["idle_cost"] for t in body["teams"]] == ["0.00", "0.00"]
    costs = monthly_report(user=admin, month=current_month())
    assert body["totals"]["idle_cost"] == costs["totals"]["idle_cost"] == "0.01"
    assert body["totals"]["unknown_utilization_gpu_hours"] == "1.00"
    client = Client()
    client.force_login(admin)
    page = client.get("/efficiency/").content.decode()
    assert 'id="efficiency-unknown"' in page and "1.00 GPU-hours had no telemetry" in page
