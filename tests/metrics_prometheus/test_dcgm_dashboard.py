"""A real Prometheus (Debian's 2.42) scrapes a live portal with two node agents (simulated GPUs) and evaluates every
expression of NVIDIA's dcgm-exporter Grafana dashboard through its HTTP API: each returns one series per GPU, told
apart by node, under both scrape configurations of docs/monitoring.md (one target with `honor_labels`, and one
target per node from the portal's HTTP service discovery)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.fleet import services
from apps.fleet.models import Gpu
from apps.telemetry.metrics import DCGM_SERIES
from tests.conftest import REPO, free_port, start_live_server, wait_http
from tests.fleet.procs import Proc, clean_fleet_redis, start_agent, start_ingest, start_portal_worker, wait_for

DASHBOARD = REPO.parent / "shared" / "data" / "nvidia-dcgm-exporter" / "dcgm-exporter-dashboard.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
NODES = {"n1": "A100-80GB,H100-80GB", "n2": "H100-80GB,A100-80GB"}  # two GPUs each: "GPU 0" on both nodes
GPUS = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="the prometheus binary is not installed"),
    pytest.mark.skipif(not DASHBOARD.exists(), reason="the dcgm-exporter dashboard is not in ../shared/data"),
]


def _dashboard() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(template variables, panel targets) of the dashboard JSON, as Grafana reads them."""
    doc = json.loads(DASHBOARD.read_text())
    targets: list[dict[str, Any]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            targets.extend(t for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(doc["panels"])
    return doc["templating"]["list"], targets


def _prom_get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    data = _prom_get(base, "/api/v1/query", query=expr)
    assert data["resultType"] == "vector", (expr, data)
    return list(data["result"])


class Prometheus:
    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        # JSON is YAML: the configuration is written as JSON.
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}"]
        argv += [f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        self.proc = Proc(argv, {"PATH": "/usr/bin:/bin"}, tmp / "prometheus.log")
        wait_http(f"{self.url}/-/ready", proc=self.proc.proc)

    def stop(self) -> None:
        self.proc.stop()


def _honor_labels_config(portal: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "gpuportal", "honor_labels": True, "static_configs": [{"targets": [portal]}]},
        ],
    }


def _http_sd_config(portal: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "gpuportal",
                "http_sd_configs": [{"url": f"http://{portal}/metrics/targets", "refresh_interval": "1s"}],
            },
        ],
    }


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[str]:
    """A live portal (web, Celery worker, telemetry ingest) with two agents reporting; yields its host:port."""
    clean_fleet_redis()
    tokens = {name: services.node_token_issue(node_name=name)[1] for name in NODES}
    procs = [start_portal_worker(tmp_path, FLEET_NODE_CACHE_S="2"), start_ingest(tmp_path, FLEET_NODE_CACHE_S="2")]
    procs += [
        start_agent(tmp_path, name, tokens[name], models=models, seed=i)
        for i, (name, models) in enumerate(NODES.items())
    ]
    server = start_live_server()
    try:
        wait_for(lambda: Gpu.objects.filter(retired_at__isnull=True).count() == GPUS, 60, "4 GPUs registered", procs)

        def all_reporting() -> bool:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
                text = response.read().decode()
            return len(re.findall(r"^DCGM_FI_DEV_GPU_TEMP\{", text, re.M)) == GPUS

        wait_for(all_reporting, 60, "/metrics to show every GPU", procs)
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop()
        for proc in reversed(procs):
            proc.stop()


def _substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value).replace(f"${{{name}}}", value)
    assert "$" not in expr, expr
    return expr


def _legend(legend_format: str, labels: dict[str, str]) -> str:
    """The series name Grafana draws: `{{label}}` replaced by the label's value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels[m.group(1)], legend_format)


def _check_dashboard(prom: str) -> None:
    variables, targets = _dashboard()
    assert len(targets) >= 8  # the dashboard parsed
    # Template variables: the node picker offers each node, the GPU picker each index.
    values: dict[str, list[str]] = {}
    for var in variables:
        if var.get("type") != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"])
        assert match, var["query"]
        metric, label = match.groups()
        values[var["name"]] = sorted(_prom_get(prom, f"/api/v1/label/{label}/values", **{"match[]": metric}))
    assert values == {"instance": ["n1", "n2"], "gpu": ["0", "1"]}

    def all_of(name: str) -> str:  # Grafana's "All" of a multi-value variable without allValue: a regex union
        return "(" + "|".join(values[name]) + ")"

    for target in targets:
        expr = target["expr"]
        aggregated = re.match(r"^\s*(avg|sum|max|min|count)\s*\(", expr) is not None
        # All nodes, all GPUs: one series per GPU, told apart by node.
        result = _query(prom, _substitute(expr, {"instance": all_of("instance"), "gpu": all_of("gpu")}))
        if aggregated:
            assert len(result) == 1, (expr, result)
        else:
            keys = sorted((r["metric"]["instance"], r["metric"]["gpu"]) for r in result)
            assert keys == [("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1")], (expr, result)
            assert len({r["metric"]["UUID"] for r in result}) == GPUS
            assert all(r["metric"]["Hostname"] == r["metric"]["instance"] for r in result)
        # One node picked: that node's GPUs only, and the legend ("GPU {{gpu}}") names each once.
        for node in values["instance"]:
            picked = _query(prom, _substitute(expr, {"instance": node, "gpu": all_of("gpu")}))
            if aggregated:
                assert len(picked) == 1, (expr, node, picked)
                continue
            assert {r["metric"]["instance"] for r in picked} == {node}, (expr, node, picked)
            legend = target.get("legendFormat") or ""
            names = [_legend(legend, r["metric"]) for r in picked]
            assert sorted(r["metric"]["gpu"] for r in picked) == ["0", "1"], (expr, node, picked)
            assert len(set(names)) == len(names) == 2, (expr, node, names)
    # Every dcgm field the portal exports: one series per GPU (A100 and H100 both have NVLink and HBM).
    for name, *_ in DCGM_SERIES:
        result = _query(prom, name)
        assert sorted((r["metric"]["instance"], r["metric"]["gpu"]) for r in result) == [
            ("n1", "0"),
            ("n1", "1"),
            ("n2", "0"),
            ("n2", "1"),
        ], (name, result)
        driver = {r["metric"]["DCGM_FI_DRIVER_VERSION"] for r in result}
        assert "" not in driver, (name, driver)  # simulated GPUs report a driver version too


@pytest.mark.parametrize("make_config", [_honor_labels_config, _http_sd_config], ids=["honor_labels", "http_sd"])
def test_every_dashboard_expression_returns_one_series_per_gpu_told_apart_by_node(fleet, tmp_path, make_config):
    (tmp_path / "prometheus").mkdir()
    prometheus = Prometheus(tmp_path / "prometheus", make_config(fleet))
    try:

        def scraped() -> bool:
            try:
                if not all(len(_query(prometheus.url, name)) == GPUS for name, *_ in DCGM_SERIES):
                    return False
                # Service discovery lists the portal's own target beside the nodes'; its first scrape may come a
                # second after theirs.
                return make_config is not _http_sd_config or bool(_query(prometheus.url, "gpuportal_gpus_reporting"))
            except OSError:
                return False

        wait_for(scraped, 60, "Prometheus to scrape every series of every GPU", [prometheus.proc])
        _check_dashboard(prometheus.url)
        if make_config is _http_sd_config:
            up = {r["metric"]["instance"]: r["value"][1] for r in _query(prometheus.url, "up")}
            assert {k: v for k, v in up.items() if k in NODES} == {"n1": "1", "n2": "1"}
            assert _query(prometheus.url, "gpuportal_gpus_reporting")[0]["value"][1] == str(GPUS)
    finally:
        prometheus.stop()
