"""What a bridge posts is checked like any client's input: every body below, each of its fields in turn replaced by
a hostile value, is answered 2xx or 4xx in the error shape, never 500. (Before, NUL in a node name, a time of 1e20,
an index of 2**63 or a 5,000-character GPU uuid reached PostgreSQL or datetime and answered 500.)"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.core.errors import ValidationFailed
from apps.fleet.models import Node
from apps.pools.api import inputs

pytestmark = pytest.mark.django_db

HOSTILE = [None, "", "x", -1, 2**31, 2**63, 2**70, 1e20, 1e308, -1e308, 0.5, True, [], {}, [None], "\x00", "a" * 5000]
T = 1.78e9
BODIES: dict[str, list[dict[str, Any]]] = {
    "poll/": [
        {"version": "slurm 23.11", "nodes": [{"name": "n1", "hostname": "n1.lab", "up": True, "gpus": [
            {"uuid": "slurm:n1:0", "index": 0, "model": "A100-80GB", "name": "a100", "memory_mib": 81920}]}]},
        {"version": "slurm 23.11", "up": ["n1"]},
    ],
    "usage/": [{"records": [
        {"external_id": 5, "account": "vision", "node": "n1", "gpus": 1, "start": T, "end": T + 60}]}],
    "jobs/1/submitted/": [{"external_id": "77"}, {"refused": "sbatch: error"}],
    "jobs/1/report/": [{"phase": "ended", "external_state": "COMPLETED", "node": "n1", "gpu_indexes": [0],
                        "started_at": T, "ended_at": T + 60, "outcome": "succeeded", "reason": "exit_code",
                        "exit_code": 0, "message": "done", "log_total": 3}],
    "jobs/1/logs/": [{"epoch": "e1", "first": 1, "lines": [{"stream": "stdout", "text": "hi", "at": T}]}],
    "reservations/1/refused/": [{"message": "no"}],
}  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def _replaced(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.fixture
def bridge(vision: Any) -> APIClient:
    from apps.pools.services import pool_create_token
    from tests.factories import GpuModelFactory

    GpuModelFactory(name="A100-80GB")
    _, token = pool_create_token(name="hpc", backend="slurm", options={"partition": "gpu"})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_hostile_fields_are_refused_in_shape(bridge: APIClient, endpoint: str):
    bad = []
    for body in BODIES[endpoint]:
        for mutated in [body] + [_replaced(body, p, v) for p in _paths(body) for v in HOSTILE]:
            raw = json.dumps(mutated)
            resp = bridge.post(f"/api/v1/pools/hpc/bridge/{endpoint}", raw, content_type="application/json")
            shaped = resp.status_code < 400 or set(resp.json()) == {"code", "detail", "fields"}
            if resp.status_code >= 500 or not shaped:
                bad.append((raw[:160], resp.status_code))
    assert not bad


def test_a_node_name_with_nul_is_a_400_naming_the_field(bridge: APIClient):
    body = _replaced(BODIES["poll/"][0], ("nodes", 0, "name"), "n\x001")
    resp = bridge.post("/api/v1/pools/hpc/bridge/poll/", body, format="json")
    assert resp.status_code == 400
    assert resp.json()["fields"] == {"name": ["a string, at most 100 characters"]}
    assert not Node.objects.exists()


@pytest.mark.parametrize("value", [1e20, -1, float("inf")])
def test_a_time_outside_datetime_is_a_400(value: float):
    with pytest.raises(ValidationFailed) as caught:
        inputs.moment({"at": value}, "at")
    assert list(caught.value.fields) == ["at"]


def test_free_text_loses_nul_and_is_cut():
    assert inputs.text({"m": "a\x00b" * 3}, "m", max_length=4) == "abab"
