"""Booking fixtures: a small fleet (node "big" with 8 A100, node "small" with 4 A100 + 2 H100), aligned times."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.booking import selectors
from apps.booking.models import Quota
from apps.core.redis import get_redis
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory


@pytest.fixture(autouse=True)
def _fresh_policy() -> None:
    selectors.policy_cache_clear()


@pytest.fixture
def a100(db: Any) -> Any:
    return GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.5000"))


@pytest.fixture
def h100(db: Any) -> Any:
    return GpuModelFactory(name="H100-80GB", display_name="NVIDIA H100", memory_mib=81920, hourly_price=Decimal("4.0"))


@pytest.fixture
def fleet(a100: Any, h100: Any) -> dict[str, Any]:
    big = NodeFactory(name="big")
    small = NodeFactory(name="small")
    gpus = {}
    for i in range(8):
        gpus[f"big/{i}"] = GpuFactory(node=big, index=i, model=a100, uuid=f"GPU-big-{i}")
    for i in range(4):
        gpus[f"small/{i}"] = GpuFactory(node=small, index=i, model=a100, uuid=f"GPU-small-{i}")
    for i in range(4, 6):
        gpus[f"small/{i}"] = GpuFactory(node=small, index=i, model=h100, uuid=f"GPU-small-{i}")
    return {"nodes": {"big": big, "small": small}, "gpus": gpus}


def slot(days: int = 1, hour: int = 10, minute: int = 0, hours: float = 2) -> tuple[datetime, datetime]:
    """[start, end) on day today+days at hour:minute (current time zone), aligned to the 15-minute grid."""
    local = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=days)
    start = local.replace(hour=hour, minute=minute)
    return start, start + timedelta(hours=hours)


def iso(moment: datetime) -> str:
    return moment.isoformat()


def book_body(team: str = "vision", *, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"team": team, "start": iso(start), "end": iso(end)}
    if "gpus" not in extra:
        body.update({"gpu_model": "A100-80GB", "gpu_count": 1})
    body.update(extra)
    return body


@pytest.fixture
def quota(vision: Any) -> Any:
    def make(**limits: Any) -> Quota:
        allowed = limits.pop("allowed_models", None)
        team = limits.pop("team", vision)
        q, _ = Quota.objects.update_or_create(team=team, month=limits.pop("month", None), defaults=limits)
        if allowed is not None:
            q.allowed_models.set(allowed)
        return q

    return make


def current_slot(hours: int = 2) -> tuple[Any, Any]:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    return start, start + timedelta(hours=hours)


def agent_messages(node: str) -> list[dict[str, Any]]:
    """Celery messages waiting on the node's queue (the Redis transport keeps a queue as a list)."""
    out = []
    for raw in get_redis().lrange(f"node.{node}", 0, -1):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        # The headers name the command, they do not repeat it (broker monitors show headers).
        assert message["headers"]["argsrepr"] == f"({message['headers']['task']} for {node})"
        out.append({"task": message["headers"]["task"], "args": args, "kwargs": kwargs})
    return out


@pytest.fixture
def agent_queue(fleet: dict[str, Any]) -> Any:
    for node in fleet["nodes"].values():
        node.token_digest = "d" * 64
        node.save(update_fields=["token_digest"])
        get_redis().delete(f"node.{node.name}")
    return agent_messages
