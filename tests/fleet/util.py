"""Builders for fleet tests: registered nodes and agent messages."""

from __future__ import annotations

import json
import time
from typing import Any

from apps.fleet import services
from apps.fleet.messages import GpuReport
from apps.fleet.models import Node
from workers.gpu.specs import get_spec


def gpu_reports(name: str, models: tuple[str, ...] = ("A100-80GB", "H100-80GB")) -> list[GpuReport]:
    return [
        GpuReport(
            uuid=f"GPU-{name}-{i}",
            index=i,
            model=m,
            name=get_spec(m).nvml_names[0],
            memory_mib=get_spec(m).memory_mib,
            mig_mode=False,
        )
        for i, m in enumerate(models)
    ]


def registered_node(name: str = "n1", models: tuple[str, ...] = ("A100-80GB", "H100-80GB")) -> tuple[Node, str]:
    """A node with a token and registered GPUs `GPU-<name>-<i>`; returns (node, token)."""
    node, token = services.node_token_issue(node_name=name)
    services.node_register(node_id=node.pk, gpus=gpu_reports(name, models), agent_version="test")
    node.refresh_from_db()
    return node, token


def row(
    uuid: str,
    util: Any = 50,
    mem: Any = 1000,
    mem_total: Any = 81920,
    temp: Any = 60,
    power: Any = 300.5,
    sm: Any = 1410,
    tensor: Any = 0.25,
    extra: dict[str, Any] | None = None,
) -> list[Any]:
    r = [uuid, util, mem, mem_total, temp, power, sm, tensor]
    if extra is not None:
        r.append(extra)
    return r


def telemetry(node: str, token: str, rows: list[list[Any]], *, ts: float | None = None, seq: int = 0) -> dict[str, Any]:
    return {
        "type": "telemetry",
        "v": 1,
        "node": node,
        "token": token,
        "ts": time.time() if ts is None else ts,
        "seq": seq,
        "f": ["uuid", "util", "mem", "mem_total", "temp", "power", "sm", "tensor"],
        "g": rows,
    }


def registration(node: str, token: str, models: tuple[str, ...] = ("A100-80GB", "H100-80GB")) -> dict[str, Any]:
    return {
        "node": node,
        "token": token,
        "ts": time.time(),
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "model": g.model,
                "name": g.name,
                "memory_mib": g.memory_mib,
                "mig_mode": g.mig_mode,
            }
            for g in gpu_reports(node, models)
        ],
        "agent_version": "0.1.0",
        "driver_version": "",
        "hostname": "h",
        "backend": "simulated",
    }


def fleet_initial(response: Any) -> dict[str, Any]:
    """The initial state the Fleet page renders into itself (its `fleet-initial` JSON script)."""
    html = response.content.decode()
    marker = '<script id="fleet-initial" type="application/json">'
    start = html.index(marker) + len(marker)
    doc: dict[str, Any] = json.loads(html[start : html.index("</script>", start)])
    return doc
