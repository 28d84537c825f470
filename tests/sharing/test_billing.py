"""Billing by the slice: a 1g.10gb MIG instance bills 1/7 of its GPU's price, a quarter share 1/4, a whole GPU of
a shared GPU 4 x 1/4; an admin's price of a profile wins; the ledger rows, the usage API and the monthly report
carry the share."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.billing import services as billing
from apps.billing.models import MigProfilePrice, UsageRecord
from apps.booking.services import allocations_create
from apps.fleet.models import Gpu
from apps.telemetry.models import GpuRollup

pytestmark = pytest.mark.django_db

PRICE = Decimal("2.8000")  # the fixture's A100 price: 1g = 0.40/h, a quarter = 0.70/h


def _hold(vision, alice, gpu: Gpu, job_id: int) -> None:
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    allocations_create(
        gpus=[gpu], team=vision, user=alice, start=end - timedelta(hours=1), end=end, kind="job", job_id=job_id
    )


def _rows(job_id: int) -> list[UsageRecord]:
    billing.ledger_close(now=timezone.now())
    return list(UsageRecord.objects.filter(source="job", source_id=job_id).order_by("gpu_id"))


def test_slices_bill_at_their_fraction(vision, alice, api_as, sharing_fleet):
    instance = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index").first()
    quarter = Gpu.devices.filter(parent=sharing_fleet["shared"]).order_by("index").first()
    assert instance is not None and quarter is not None
    _hold(vision, alice, instance, 1)
    _hold(vision, alice, quarter, 2)
    (mig,) = _rows(1)
    assert mig.share == Decimal("0.142857")
    assert mig.gpu_seconds == round(3600 / 7)
    assert mig.cost.quantize(Decimal("0.01")) == Decimal("0.40")
    (share,) = _rows(2)
    assert (share.share, share.gpu_seconds, share.cost) == (Decimal("0.25"), 900, Decimal("0.70"))
    usage = {r["source_id"]: r for r in api_as(alice).get("/api/v1/usage/").json()["results"]}
    assert Decimal(usage[2]["share"]) == Decimal("0.25")
    month = timezone.localtime(mig.start).strftime("%Y-%m")
    report = api_as(alice).get(f"/api/v1/reports/monthly/?month={month}&team=vision").json()
    assert "1.10" in str(report)  # 0.40 + 0.70, the slices at their fraction of the price


def test_whole_gpu_of_a_shared_gpu_bills_once(vision, alice, sharing_fleet):
    for n, part in enumerate(Gpu.devices.filter(parent=sharing_fleet["shared"]).order_by("index")):
        end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
        allocations_create(
            gpus=[part], team=vision, user=alice, start=end - timedelta(hours=1), end=end, kind="job", job_id=10
        )
        assert n < 4
    rows = _rows(10)
    assert len(rows) == 4
    assert sum(r.cost for r in rows) == PRICE
    assert sum(r.gpu_seconds for r in rows) == 3600


def test_an_admins_profile_price_wins(vision, alice, sharing_fleet):
    MigProfilePrice.objects.create(gpu_model=sharing_fleet["model"], profile="1g.10gb", hourly_price=Decimal("0.5"))
    instance = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index").first()
    assert instance is not None
    _hold(vision, alice, instance, 3)
    (row,) = _rows(3)
    assert row.cost == Decimal("0.5")


def test_the_live_rate_counts_each_slice_at_its_price(vision, alice, api_as, client, sharing_fleet):
    """While a 1g instance (admin-priced), a quarter share and a 1g instance at the default price run, the team's
    figures count them as 1/7 + 1/7 + 1/4 of a GPU at the slices' prices, not as three whole GPUs."""
    MigProfilePrice.objects.create(gpu_model=sharing_fleet["model"], profile="1g.10gb", hourly_price=Decimal("0.5"))
    first, second = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index")[:2]
    quarter = Gpu.devices.filter(parent=sharing_fleet["shared"]).order_by("index").first()
    assert quarter is not None
    now = timezone.now()
    for n, gpu in enumerate((first, second, quarter)):
        allocations_create(
            gpus=[gpu],
            team=vision,
            user=alice,
            start=now - timedelta(minutes=5),
            end=now + timedelta(hours=1),
            kind="job",
            job_id=20 + n,
        )
    usage = api_as(alice).get("/api/v1/teams/vision/").json()["usage"]
    assert usage["running_gpus"] == 3
    assert usage["running_gpu_share"] == "0.5357"  # 1/7 + 1/7 + 1/4
    assert usage["running_hourly_cost"] == "1.70"  # 0.50 + 0.50 (the profile's price) + 2.80 / 4
    client.force_login(alice)
    page = client.get("/costs/teams/vision/").content.decode()
    assert '<span id="live-running">0.5357</span> GPUs running' in page


def test_shares_of_any_split_add_up_to_exactly_one_gpu():
    from apps.fleet.devices import MAX_SHARES, share_capacity

    for n in range(2, MAX_SHARES + 1):
        parts = [share_capacity(n, i) for i in range(n)]
        assert sum(parts) == 1, n
        assert all(abs(p - Decimal(1) / n) < Decimal("0.000001") for p in parts), n


def test_a_whole_gpu_split_in_three_bills_the_whole_price_not_three_roundings(vision, alice, sharing_fleet):
    from apps.fleet.devices import gpu_set_shares

    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=3)
    parts = list(Gpu.devices.filter(parent=sharing_fleet["shared"], retired_at__isnull=True).order_by("index"))
    assert [p.capacity for p in parts] == [Decimal("0.333334"), Decimal("0.333333"), Decimal("0.333333")]
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    allocations_create(
        gpus=parts, team=vision, user=alice, start=end - timedelta(hours=1), end=end, kind="job", job_id=11
    )
    rows = _rows(11)
    assert len(rows) == 3
    assert sum(r.cost for r in rows) == PRICE
    assert sum(r.gpu_seconds for r in rows) == 3600


def test_the_migration_makes_shares_split_before_add_up_to_one(sharing_fleet):
    import importlib

    from django.apps import apps as registry

    from apps.fleet.devices import gpu_set_shares

    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=3)
    parts = Gpu.devices.filter(parent=sharing_fleet["shared"], retired_at__isnull=True)
    parts.update(capacity=Decimal("0.333333"))  # as a GPU split in 3 was stored before
    migration = importlib.import_module("apps.fleet.migrations.0005_share_capacities_exact")
    migration.exact_capacities(registry, None)
    assert sum(p.capacity for p in parts.all()) == 1
    assert {p.capacity for p in Gpu.devices.filter(parent=sharing_fleet["mig"])} == {Decimal("0.142857")}


def test_the_monthly_report_shows_each_slice_at_its_fraction(vision, alice, admin, api_as, client, sharing_fleet):
    """JSON, CSV, the Costs page and the PDF statement list the slices (MIG instances by profile, shares by size),
    each at its fraction of the GPU's price; a month closed before the report had slices still reads."""
    import csv
    import io

    from pypdf import PdfReader

    from apps.billing.models import MonthClose

    instance = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index").first()
    quarter = Gpu.devices.filter(parent=sharing_fleet["shared"]).order_by("index").first()
    assert instance is not None and quarter is not None
    _hold(vision, alice, instance, 1)
    _hold(vision, alice, quarter, 2)
    (row,) = _rows(1)
    month = timezone.localtime(row.start).strftime("%Y-%m")
    url = f"/api/v1/reports/monthly/?month={month}&team=vision"
    report = api_as(admin).get(url).json()
    (team,) = report["teams"]
    slices = {(x["gpu_model"], x["slice"]): (x["share"], x["gpu_hours"], x["cost"]) for x in team["by_slice"]}
    assert slices == {
        ("A100-80GB", "1g.10gb"): ("0.142857", "0.143", "0.40"),
        ("A100-80GB", "1/4 share"): ("0.250000", "0.250", "0.70"),
    }
    assert report["totals"]["by_slice"] == team["by_slice"]

    lines = list(csv.reader(io.StringIO(api_as(admin).get(url + "&format=csv").content.decode())))
    assert ["vision", "slice", "A100-80GB 1g.10gb", "0.143", "0.40"] in [r[1:6] for r in lines]
    client.force_login(admin)
    page = client.get(f"/costs/?month={month}").content.decode()
    assert "of which slices: A100-80GB 1/4 share: 0.70" in page and "A100-80GB 1g.10gb: 0.40" in page
    pdf = client.get(f"/costs/report/{month}/vision.pdf")
    text = PdfReader(io.BytesIO(pdf.content)).pages[0].extract_text()
    assert "Of which slices of GPUs" in text and "A100-80GB 1/4 share" in text

    MonthClose.objects.create(
        month=row.month, status="closed", closed_at=timezone.now(),
        figures={"month": month, "teams": {"vision": {"name": "Vision", "team_id": vision.pk,
                                                       "by_gpu_model": {}, "by_user": {}}}},
    )  # fmt: skip
    frozen = api_as(admin).get(url).json()
    assert (frozen["status"], frozen["teams"][0]["by_slice"], frozen["totals"]["by_slice"]) == ("closed", [], [])


def test_an_instances_sm_activity_gives_its_ledger_rows_an_idle_cost(vision, alice, admin, api_as, sharing_fleet):
    """Where GPM gives a MIG instance's SM activity (Hopper and later; kept in the instance's own minute rollups),
    its ledger rows carry it and the report counts the instance's idle cost; an instance with only its memory
    (an A100) stays unknown, as before."""
    from tests.efficiency.conftest import write_minutes

    first, second = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index")[:2]
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    write_minutes(first, end - timedelta(hours=1), 60, util=25.0, mem=5_000)
    GpuRollup.objects.bulk_create(
        [GpuRollup(gpu=second, minute=end - timedelta(minutes=60 - i), samples=60, mem_used_mean=900,
                   mem_used_max=900) for i in range(60)]
    )  # fmt: skip
    _hold(vision, alice, first, 1)
    _hold(vision, alice, second, 2)
    (measured,) = _rows(1)
    (memory_only,) = _rows(2)
    assert measured.mean_utilization == Decimal("0.25") and memory_only.mean_utilization is None
    month = timezone.localtime(measured.start).strftime("%Y-%m")
    (team,) = api_as(admin).get(f"/api/v1/reports/monthly/?month={month}&team=vision").json()["teams"]
    (instances,) = team["by_slice"]
    assert (instances["slice"], instances["cost"], instances["idle_cost"]) == ("1g.10gb", "0.80", "0.30")
    assert (instances["mean_utilization"], instances["idle_cost_complete"]) == ("0.2500", False)
    assert instances["unknown_utilization_gpu_hours"] == "0.143"


def test_a_share_jobs_own_sm_activity_gives_its_ledger_rows_an_idle_cost(vision, alice, admin, api_as, sharing_fleet):
    """A job on a share: its ledger rows take the SM activity its node attributed to the job itself (per minute in
    JobMemoryMinute), never the GPU's (its neighbours' too)."""
    from apps.jobs.models import Job, JobState
    from apps.telemetry.models import JobMemoryMinute

    quarter, other = Gpu.devices.filter(parent=sharing_fleet["shared"]).order_by("index")[:2]
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["python", "serve.py"], gpu_count=1, cpus=Decimal(1),
        memory_mib=1024, max_duration_s=7200, state=JobState.SUCCEEDED, started_at=end - timedelta(hours=1),
        ended_at=end,
    )  # fmt: skip
    parent = sharing_fleet["shared"]
    JobMemoryMinute.objects.bulk_create(
        [JobMemoryMinute(job=job, gpu=parent, minute=end - timedelta(minutes=60 - i), mem_used_max=2_000,
                         util_mean=10.0 if i < 30 else 30.0) for i in range(60)]
    )  # fmt: skip
    from tests.efficiency.conftest import write_minutes

    write_minutes(parent, end - timedelta(hours=1), 60, util=90.0, mem=40_000)  # the GPU, busy with the neighbours
    _hold(vision, alice, quarter, job.pk)
    _hold(vision, alice, other, job.pk + 1000)  # a job with no reading of its own: unknown, not the GPU's 90%
    (row,) = _rows(job.pk)
    assert row.mean_utilization == Decimal("0.2") and row.share == Decimal("0.25")
    (unread,) = _rows(job.pk + 1000)
    assert unread.mean_utilization is None
    month = timezone.localtime(row.start).strftime("%Y-%m")
    (team,) = api_as(admin).get(f"/api/v1/reports/monthly/?month={month}&team=vision").json()["teams"]
    (share,) = team["by_slice"]
    assert (share["slice"], share["cost"], share["idle_cost"], share["idle_cost_complete"]) == (
        "1/4 share",
        "1.40",
        "0.56",
        False,
    )


def test_a_share_reservations_own_work_gives_its_ledger_rows_an_idle_cost(vision, alice, bob, sharing_fleet):
    """A reservation of a quarter, the only one on its GPU: its rows take what no job's processes did there
    (GpuRollup.others_util_mean), not the GPU's figure (a neighbour's job keeps it busy). Two reservations on one
    GPU in the same hour: unknown, as before."""
    from tests.billing.helpers import reserve
    from tests.efficiency.conftest import write_minutes

    parent = sharing_fleet["shared"]
    first, second, third = Gpu.devices.filter(parent=parent).order_by("index")[:3]
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=1)
    write_minutes(parent, start - timedelta(hours=1), 120, util=90.0, mem=40_000)
    GpuRollup.objects.filter(gpu=parent, minute__gte=start).update(others_util_mean=15.0, others_mem_max=6_000)
    GpuRollup.objects.filter(gpu=parent, minute__lt=start).update(others_util_mean=50.0, others_mem_max=6_000)
    (alone,) = reserve(vision, alice, [first], start, end)
    # An hour earlier, two reservations on the same GPU: whose processes are whose cannot be told.
    (one,) = reserve(vision, alice, [second], start - timedelta(hours=1), start)
    (two,) = reserve(vision, bob, [third], start - timedelta(hours=1), start)
    billing.ledger_close(now=timezone.now())
    row = UsageRecord.objects.get(source="reservation", source_id=alone.reservation_id)
    assert row.mean_utilization == Decimal("0.15") and row.share == Decimal("0.25")
    for shared in (one, two):
        assert UsageRecord.objects.get(source="reservation", source_id=shared.reservation_id).mean_utilization is None


def test_the_costs_page_heatmap_counts_a_gpus_parts_in_its_row(vision, alice, admin, sharing_fleet, client):
    """Ledger rows of MIG instances with their own utilization: the Costs page draws them in their GPU's row,
    weighted by GPU-seconds (the page failed on the first such row: it looked instances up as physical GPUs)."""
    import json

    from apps.billing import selectors

    first, second = Gpu.devices.filter(parent=sharing_fleet["mig"]).order_by("index")[:2]
    _hold(vision, alice, first, 1)
    _hold(vision, alice, second, 2)
    billing.ledger_close(now=timezone.now())
    UsageRecord.objects.filter(gpu=first).update(mean_utilization=Decimal("0.9"))
    UsageRecord.objects.filter(gpu=second).update(mean_utilization=Decimal("0.3"))
    month = UsageRecord.objects.filter(gpu=first).values_list("month", flat=True).first()
    assert month is not None
    heatmap = selectors.utilization_heatmap(month=month)
    assert heatmap["gpus"] == ["mig/0 A100-80GB"]
    assert [v for v in heatmap["values"][0] if v is not None] == [0.6]  # (0.9 + 0.3) / 2: equal GPU-seconds
    client.force_login(admin)
    resp = client.get(f"/costs/?month={month:%Y-%m}")
    assert resp.status_code == 200
    data = json.loads(resp.content.decode().split('id="costs-data" type="application/json">')[1].split("</script>")[0])
    assert data["heatmap"]["gpus"] == ["mig/0 A100-80GB"]
