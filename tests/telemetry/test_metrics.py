"""/metrics: valid Prometheus text, every series NVIDIA's dcgm-exporter dashboard queries, portal gauges."""

from __future__ import annotations

import json
import re
import time

import pytest
from django.test import Client

from apps.telemetry.ingest import telemetry_ingest
from tests.conftest import REPO
from tests.fleet.util import registered_node, row, telemetry
from tests.telemetry.promtext import ParseError, parse

pytestmark = pytest.mark.django_db

DASHBOARD = REPO.parent / "shared" / "data" / "nvidia-dcgm-exporter" / "dcgm-exporter-dashboard.json"


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    found: list[str] = []

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("expr", "query", "definition") and isinstance(v, str):
                    found.append(v)
                walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    walk(doc)
    return found


def _scrape(client: Client | None = None, **headers: str) -> str:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def _fleet_with_samples() -> None:
    _, token1 = registered_node("n1", ("A100-80GB", "H100-80GB"))
    _, token2 = registered_node("n2", ("L40S-48GB",))
    telemetry_ingest(telemetry("n1", token1, [row("GPU-n1-0", util=87), row("GPU-n1-1", tensor=None)]))
    telemetry_ingest(telemetry("n2", token2, [row("GPU-n2-0", mem_total=46068, mem=46000)]))


@pytest.mark.skipif(not DASHBOARD.exists(), reason="the dcgm-exporter dashboard is not in ../shared/data")
def test_every_series_the_dcgm_dashboard_queries_is_present() -> None:
    _fleet_with_samples()
    families = parse(_scrape())
    queries = dashboard_queries()
    wanted = {m for q in queries for m in re.findall(r"\bDCGM_[A-Z0-9_]+\b", q)}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= wanted  # the dashboard parsed
    for metric in sorted(wanted):
        assert metric in families and families[metric].samples, f"{metric} missing from /metrics"
        for labels, _ in families[metric].samples:
            assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= set(labels)
    # The dashboard's template variables group by these labels.
    for q in queries:
        for label in re.findall(r"label_values\(\w+,\s*(\w+)\)", q):
            if label != "instance":  # added by Prometheus at scrape time
                assert all(label in lab for lab, _ in families["DCGM_FI_DEV_GPU_TEMP"].samples)


def test_gpu_series_carry_dcgm_labels_and_values() -> None:
    _fleet_with_samples()
    families = parse(_scrape())
    util = {lab["UUID"]: (lab, v) for lab, v in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    labels, value = util["GPU-n1-0"]
    assert value == 87
    assert labels == {
        "gpu": "0",
        "UUID": "GPU-n1-0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "n1",
        "DCGM_FI_DRIVER_VERSION": "",
        "instance": "n1",  # the node: kept by a Prometheus job with honor_labels (docs/monitoring.md)
    }
    free = {lab["UUID"]: v for lab, v in families["DCGM_FI_DEV_FB_FREE"].samples}
    assert free["GPU-n2-0"] == 68
    tensor = {lab["UUID"] for lab, _ in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples}
    assert "GPU-n1-1" not in tensor  # null reading: no series, not a fake zero
    assert families["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"


def test_portal_gauges_and_counters() -> None:
    _fleet_with_samples()
    families = parse(_scrape())
    nodes = {lab["status"]: v for lab, v in families["gpuportal_nodes"].samples}
    assert nodes == {"online": 2, "draining": 0, "offline": 0}
    gpus = {lab["status"]: v for lab, v in families["gpuportal_gpus"].samples}
    assert gpus["ok"] == 3
    assert families["gpuportal_telemetry_samples_total"].samples[0][1] == 3
    assert families["gpuportal_telemetry_messages_total"].type == "counter"
    assert {lab["queue"] for lab, _ in families["gpuportal_queue_length"].samples} == {"control", "portal"}
    assert families["gpuportal_gpus_reporting"].samples[0][1] == 3


def test_stale_gpus_export_no_series(monkeypatch) -> None:
    _fleet_with_samples()
    from apps.telemetry import metrics

    later = time.time() + 60
    families = parse(metrics.render(now=later))
    assert families["DCGM_FI_DEV_GPU_UTIL"].samples == []
    assert families["gpuportal_gpus_reporting"].samples[0][1] == 0


def test_an_empty_fleet_is_still_valid() -> None:
    families = parse(_scrape())
    assert families["DCGM_FI_DEV_GPU_UTIL"].samples == []


def test_metrics_token_when_configured(settings) -> None:
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    parse(_scrape(HTTP_AUTHORIZATION="Bearer s3cret-scrape-token"))


def test_label_values_are_escaped() -> None:
    from apps.fleet.models import Gpu

    _fleet_with_samples()
    Gpu.objects.filter(uuid="GPU-n1-0").update(name='Weird "GPU"\\ name\nline')
    families = parse(_scrape())
    names = {lab["modelName"] for lab, _ in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert 'Weird "GPU"\\ name\nline' in names


def test_the_parser_is_strict() -> None:
    for bad in (
        "x 1",
        "# TYPE x gauge\nx 1\n",
        '# HELP x h\n# TYPE x gauge\nx{a="1",a="2"} 1\n',
        "# HELP x h\n# TYPE x gauge\nx one\n",
        "# HELP x h\n# TYPE x gauge\ny 1\n",
    ):
        with pytest.raises(ParseError):
            parse(bad)


def test_device_counters_reach_metrics_under_dcgm_names_and_types() -> None:
    _, token = registered_node("n1", ("A100-80GB", "H100-80GB"))
    counters = [47, 1593, 123_456_789, 2_048, 4_096, 2, 9_000]  # mt, mc, en, ptx, prx (KB/s), prc, nvl
    health = {"xid": 1, "last_xid": 79, "remap_cor": 3, "remap_unc": 1, "remap_fail": True}
    bad = [-5, "fast", 10**30, None, None, 0, None, 1]  # bad ones left out alone; an eighth position is ignored
    telemetry_ingest(
        telemetry(
            "n1",
            token,
            [row("GPU-n1-0", extra={"x": counters, "h": health}), row("GPU-n1-1", util=7, extra={"x": bad})],
        )
    )
    families = parse(_scrape())

    def value(metric: str, uuid: str) -> float | None:
        return next((v for lab, v in families[metric].samples if lab["UUID"] == uuid), None)

    expected = {
        "DCGM_FI_DEV_MEMORY_TEMP": 47,
        "DCGM_FI_DEV_MEM_CLOCK": 1593,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123_456_789,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 2_097_152,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 4_194_304,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 2,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 9_000,
        "DCGM_FI_DEV_XID_ERRORS": 79,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 3,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1,
    }
    assert {m: value(m, "GPU-n1-0") for m in expected} == expected
    # dcgm-exporter's types, and its names: counters without prometheus-client's `_total`.
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert families["DCGM_FI_DEV_XID_ERRORS"].type == "gauge"
    # The second row's bad counters are dropped, not the row; its health counters read as all clear.
    assert value("DCGM_FI_DEV_GPU_UTIL", "GPU-n1-1") == 7
    assert value("DCGM_FI_DEV_MEMORY_TEMP", "GPU-n1-1") is None
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "GPU-n1-1") is None
    assert value("DCGM_FI_DEV_XID_ERRORS", "GPU-n1-1") == 0


def test_a_row_without_device_counters_exports_no_health_series() -> None:
    _fleet_with_samples()  # rows as an older agent sends them: no "x", no health
    families = parse(_scrape())
    assert families["DCGM_FI_DEV_XID_ERRORS"].samples == []
    assert families["DCGM_FI_DEV_GPU_UTIL"].samples


def test_one_nodes_series_and_the_portal_scope() -> None:
    _fleet_with_samples()
    n1 = parse(_scrape_path("/metrics?node=n1"))
    assert {lab["instance"] for lab, _ in n1["DCGM_FI_DEV_GPU_UTIL"].samples} == {"n1"}
    assert len(n1["DCGM_FI_DEV_GPU_UTIL"].samples) == 2
    assert not any(name.startswith("gpuportal_") for name in n1)  # those come from the portal's own target
    # A GPU's own portal series go with its node's: n2's GPU is in use outside the portal (46,000 MiB).
    n2 = parse(_scrape_path("/metrics?node=n2"))
    assert {lab["UUID"] for lab, _ in n2["gpuportal_gpu_memory_used_outside_mib"].samples} == {"GPU-n2-0"}
    portal = parse(_scrape_path("/metrics?scope=portal"))
    assert not any(name.startswith(("DCGM_", "gpuportal_gpu_memory")) for name in portal)
    assert portal["gpuportal_gpus_reporting"].samples[0][1] == 3
    for bad, status in (("/metrics?node=ghost", 404), ("/metrics?scope=everything", 400)):
        response = Client().get(bad)
        assert response.status_code == status
        assert set(response.json()) == {"code", "detail", "fields"}


def test_service_discovery_lists_a_target_per_node_and_one_for_the_portal(settings) -> None:
    _fleet_with_samples()
    settings.ALLOWED_HOSTS = ["portal.example"]
    response = Client().get("/metrics/targets", HTTP_HOST="portal.example:8000")
    assert response.status_code == 200
    groups = response.json()
    assert [g["labels"].get("__param_node") for g in groups] == ["n1", "n2", None]
    assert all(g["targets"] == ["portal.example:8000"] for g in groups)
    assert groups[0]["labels"]["instance"] == "n1" and groups[-1]["labels"]["__param_scope"] == "portal"
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics/targets", HTTP_HOST="portal.example").status_code == 401
    assert Client().get("/metrics?node=n1", HTTP_HOST="portal.example").status_code == 401
    ok = Client().get("/metrics/targets", HTTP_HOST="portal.example", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert ok.status_code == 200


def _scrape_path(path: str) -> str:
    response = Client().get(path)
    assert response.status_code == 200, response.content
    return response.content.decode()


def test_gpus_in_use_outside_the_portal_have_a_series(monkeypatch) -> None:
    _fleet_with_samples()  # GPU-n1-0/1 use 1,000 MiB (the driver's own, under 1 GiB); GPU-n2-0 uses 46,000 MiB
    families = parse(_scrape())
    outside = {lab["UUID"]: (lab, v) for lab, v in families["gpuportal_gpu_memory_used_outside_mib"].samples}
    assert list(outside) == ["GPU-n2-0"]
    labels, value = outside["GPU-n2-0"]
    assert value == 46000 and labels["Hostname"] == "n2" and labels["device"] == "nvidia0"
    assert families["gpuportal_gpu_memory_used_outside_mib"].type == "gauge"
    # A GPU the portal holds uses its memory for its holder: no series.
    holder = {"kind": "job", "id": 3, "team": "vision", "team_id": 1, "user": "bob", "until": None}
    monkeypatch.setattr("apps.telemetry.metrics.gpu_holders", lambda: {"GPU-n2-0": holder})
    assert "gpuportal_gpu_memory_used_outside_mib" not in parse(_scrape())
