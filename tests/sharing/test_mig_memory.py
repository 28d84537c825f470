"""Memory used per MIG instance: the agent's `"m"` list in a telemetry row, through ingest, to the GPU API, the
Fleet snapshot (the holder of each instance) and /metrics. Bad entries are dropped alone, like bad counters."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from apps.fleet import services
from apps.fleet.messages import MAX_MIG_INSTANCES, check_row
from apps.telemetry import metrics
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.metrics import render as render_metrics
from apps.telemetry.publisher import FleetPublisher
from tests.fleet.util import fleet_initial, row, telemetry

URL = "/api/v1/reservations/"
FIRST, SECOND = "MIG-mig-0-7", "MIG-mig-0-8"  # two of the seven 1g.10gb instances of GPU-mig-0 (conftest)


def _report(used: list[Any], *, mem: int = 7_000) -> None:
    _, token = services.node_token_issue(node_name="mig")
    result = telemetry_ingest(telemetry("mig", token, [row("GPU-mig-0", mem=mem, extra={"m": used})]))
    assert result.accepted == 1


def _book_instance(api_as: Any, alice: Any) -> str:
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    held = {"team": "vision", "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    resp = api_as(alice).post(URL, {**held, "mig_profile": "1g.10gb"}, format="json")
    assert resp.status_code == 201, resp.content
    uuid: str = resp.json()["gpus"][0]["uuid"]
    return uuid


def test_a_row_keeps_good_instance_readings_and_drops_bad_ones_alone():
    good = row("GPU-x", mem=9_000, mem_total=81_920, extra={"m": [[FIRST, 5_000], [SECOND, 0]]})
    assert check_row(good).mig_memory == {FIRST: 5_000, SECOND: 0}
    bad_entries = [
        [FIRST, 5_000],
        [SECOND, -1],  # negative
        ["MIG-c", 90_000],  # above the GPU's memory
        ["MIG-d", True],  # not a number
        ["MIG-e", 1.5],
        ["bad uuid!", 10],
        ["MIG-f"],
        "MIG-g",
    ]
    parsed = check_row(row("GPU-x", extra={"m": bad_entries}))
    assert parsed.mig_memory == {FIRST: 5_000}
    assert parsed.util == 50  # the rest of the row is untouched
    assert check_row(row("GPU-x", extra={"m": {"MIG-a": 1}})).mig_memory == {}
    many = [[f"MIG-{i}", i] for i in range(MAX_MIG_INSTANCES + 5)]
    assert len(check_row(row("GPU-x", extra={"m": many})).mig_memory) == MAX_MIG_INSTANCES
    assert check_row(row("GPU-x")).mig_memory == {}


def test_gpu_api_shows_what_each_instance_uses(api_as, alice, sharing_fleet):
    mine = _book_instance(api_as, alice)
    _report([[mine, 5_120, 64], [SECOND if mine != SECOND else FIRST, 13]])  # its SM activity too (GPM)
    gpus = {g["uuid"]: g for g in api_as(alice).get("/api/v1/gpus/").json()["results"]}
    instances = {i["uuid"]: i for i in gpus["GPU-mig-0"]["mig_devices"]}
    assert instances[mine]["memory_used_mib"] == 5_120 and instances[mine]["memory_mib"] == 9_728
    assert [i["sm_active_pct"] for i in instances.values() if i["sm_active_pct"] is not None] == [64]
    reported = {uuid for uuid, i in instances.items() if i["memory_used_mib"] is not None}
    assert len(reported) == 2  # the five instances the agent did not report are unknown, not zero
    assert gpus["GPU-mig-0"]["memory_used_mib"] == 7_000  # the GPU's own reading is unchanged


@pytest.mark.django_db(transaction=True)  # the publisher closes stale connections, as its process does
def test_fleet_snapshot_and_metrics_show_the_held_instances_memory(api_as, alice, sharing_fleet):
    mine = _book_instance(api_as, alice)
    other = SECOND if mine != SECOND else FIRST
    _report([[mine, 5_120], [other, 13]])
    mig = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-mig-0"]
    assert [(h["part"], h["part_uuid"], h["mem"], h["used"]) for h in mig["holder"]] == [
        ("1g.10gb", mine, 9_728, 5_120)
    ]
    # Every instance's reading, held or not, for the GPU page's table.
    assert mig["parts"]["used"] == {mine: 5_120, other: 13}
    lines = [line for line in render_metrics().splitlines() if line.startswith("gpuportal_mig_instance_memory_used")]
    assert sorted(line.rsplit(" ", 1)[1] for line in lines) == ["13", "5120"]  # one series per reported instance
    assert all('UUID="GPU-mig-0"' in line and 'GPU_I_PROFILE="1g.10gb"' in line for line in lines)


@pytest.mark.django_db(transaction=True)
def test_an_instances_sm_activity_shows_live_where_gpm_gives_it(api_as, alice, client, sharing_fleet):
    mine = _book_instance(api_as, alice)
    other = SECOND if mine != SECOND else FIRST
    _report([[mine, 5_120, 62], [other, 13]])
    mig = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-mig-0"]
    assert mig["parts"]["busy"] == {mine: 62}
    lines = [line for line in render_metrics().splitlines() if line.startswith("gpuportal_mig_instance_sm_active")]
    assert len(lines) == 1 and lines[0].endswith(" 0.62") and 'GPU_I_PROFILE="1g.10gb"' in lines[0]
    # Without the third element (no GPM: an A100) there is no such series, and no "busy".
    _report([[mine, 5_120], [other, 13]])
    assert "busy" not in {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-mig-0"]["parts"]
    assert "gpuportal_mig_instance_sm_active{" not in render_metrics()


@pytest.mark.django_db(transaction=True)
def test_a_stale_sample_shows_no_instance_memory(api_as, alice, sharing_fleet, monkeypatch):
    mine = _book_instance(api_as, alice)
    _report([[mine, 5_120]])
    later = time.time() + 60  # the agent has been silent for a minute
    mig = {g["uuid"]: g for g in FleetPublisher().build(now=later)["gpus"]}["GPU-mig-0"]
    assert mig["stale"] and [h["used"] for h in mig["holder"]] == [None] and "used" not in mig["parts"]
    monkeypatch.setattr(metrics, "time", SimpleNamespace(time=lambda: later))
    series = [line for line in render_metrics().splitlines() if line.startswith("gpuportal_mig_instance_")]
    assert series and not any(line.startswith("gpuportal_mig_instance_memory_used") for line in series)


def test_the_gpu_page_lists_its_parts(client, alice, sharing_fleet):
    client.force_login(alice)
    page = client.get("/fleet/gpus/GPU-mig-0/").content.decode()
    assert page.count('<tr data-part="MIG-mig-0-') == 7 and "<h2>MIG instances</h2>" in page
    assert page.count("<meter") == 7 and '<meter min="0" max="9728"' in page
    shared = client.get("/fleet/gpus/GPU-shared-0/").content.decode()
    assert [f"share {i}/4" in shared for i in range(1, 5)] == [True] * 4
    assert "<h2>Shares</h2>" in shared and "no memory isolation" in shared
    assert shared.count('<meter min="0" max="20480"') == 4  # each share's job's own memory, live
    assert 'id="gpu-parts"' not in client.get("/fleet/gpus/GPU-shared-1/").content.decode()


def test_the_fleet_page_shows_parts_before_any_snapshot_was_published(client, api_as, alice, charlie, sharing_fleet):
    from apps.core.redis import get_redis
    from apps.telemetry import keys

    get_redis().delete(keys.SNAPSHOT_LAST)
    mine = _book_instance(api_as, alice)
    _report([[mine, 5_120]])
    for viewer, sees_user in ((alice, True), (charlie, False)):
        client.force_login(viewer)
        gpus = {g["uuid"]: g for g in fleet_initial(client.get("/fleet/"))["snapshot"]["gpus"]}
        mig, shared = gpus["GPU-mig-0"], gpus["GPU-shared-0"]
        assert mig["parts"] == {"kind": "mig", "total": 7, "free": 6, "used": {mine: 5_120}}
        (holder,) = mig["holder"]
        assert (holder["part"], holder["part_uuid"], holder["used"]) == ("1g.10gb", mine, 5_120)
        assert holder["team"] == "vision"
        assert ("user" in holder) is sees_user
        assert shared["parts"] == {"kind": "share", "total": 4, "free": 4} and shared["holder"] is None


def test_the_history_api_gives_each_instances_memory(api_as, alice, sharing_fleet):
    from apps.fleet.models import Gpu
    from apps.telemetry.models import GpuHourlyRollup, GpuRollup

    first = Gpu.devices.get(uuid=FIRST)
    now = timezone.now().replace(second=0, microsecond=0)
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu=first, minute=now - timedelta(minutes=m), samples=60, mem_used_mean=4_000.0, mem_used_max=5_000)
        for m in (3, 2, 1)
    )
    GpuHourlyRollup.objects.create(gpu=first, hour=now.replace(minute=0), samples=60, mem_used_max=5_000)
    url = "/api/v1/gpus/GPU-mig-0/history/"
    data = api_as(alice).get(url, {"hours": 1}).json()
    assert data["resolution"] == "minute" and data["points"] == []  # the GPU's own rows: none written here
    instances = {i["uuid"]: i for i in data["instances"]}
    assert len(instances) == 7 and [i["gi_id"] for i in data["instances"]] == list(range(7, 14))
    mine = instances[FIRST]
    assert (mine["profile"], mine["memory_mib"]) == ("1g.10gb", 9_728)
    assert [p["mem_used_max"] for p in mine["points"]] == [5_000] * 3
    assert mine["points"][0]["t"] < mine["points"][-1]["t"]  # oldest first
    assert instances[SECOND]["points"] == []
    hourly = api_as(alice).get(url, {"hours": 1, "resolution": "hour"}).json()
    assert [p["mem_used_max"] for p in {i["uuid"]: i for i in hourly["instances"]}[FIRST]["points"]] == [5_000]
    assert api_as(alice).get(url, {"resolution": "raw"}).json()["instances"] == []
    assert api_as(alice).get("/api/v1/gpus/GPU-shared-0/history/").json()["instances"] == []
