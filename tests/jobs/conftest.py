"""Fixtures for the jobs tests: a small fleet (node01: 4 x A100, node02: 8 x H100), the image allow-list, and a
helper that submits through the service."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.fleet.models import GpuStatus, NodeStatus
from apps.jobs import services
from apps.jobs.models import ContainerImage, Job
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

BUSYBOX = "portal-test/busybox:latest"
PROCESS_IMAGE = "local/process"


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    from apps.core import ttlcache

    ttlcache.clear_all()


@pytest.fixture
def fleet(db: Any) -> dict[str, Any]:
    a100 = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.5000"))
    h100 = GpuModelFactory(
        name="H100-80GB", display_name="NVIDIA H100", memory_mib=81920, hourly_price=Decimal("4.0000")
    )
    now = timezone.now()
    node01 = NodeFactory(name="node01", status=NodeStatus.ONLINE, last_heartbeat=now)
    node02 = NodeFactory(name="node02", status=NodeStatus.ONLINE, last_heartbeat=now)
    for node in (node01, node02):
        node.token_digest = "d" * 64
        node.save(update_fields=["token_digest"])
    gpus01 = [
        GpuFactory(node=node01, index=i, model=a100, uuid=f"GPU-a100-{i:04d}", status=GpuStatus.OK) for i in range(4)
    ]
    gpus02 = [
        GpuFactory(node=node02, index=i, model=h100, uuid=f"GPU-h100-{i:04d}", status=GpuStatus.OK) for i in range(8)
    ]
    return {"a100": a100, "h100": h100, "node01": node01, "node02": node02, "gpus01": gpus01, "gpus02": gpus02}


@pytest.fixture
def images(db: Any) -> list[ContainerImage]:
    return [
        ContainerImage.objects.create(
            name=BUSYBOX,
            description="busybox for tests",
            allowed_mounts=[{"host_path": "/srv/datasets", "container_path": "/data", "read_only": True}],
        ),
        ContainerImage.objects.create(name=PROCESS_IMAGE, description="process runtime"),
    ]


@pytest.fixture
def submit(fleet: Any, images: Any) -> Callable[..., Job]:
    def make(user: Any, team: Any, **fields: Any) -> Job:
        fields.setdefault("image", BUSYBOX)
        fields.setdefault("command", ["echo", "hi"])
        fields.setdefault("max_duration_s", 600)
        return services.job_submit(user=user, team=team, **fields)

    return make
