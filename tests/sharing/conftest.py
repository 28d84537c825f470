"""Sharing fixtures: node "mig" with an A100-80GB in MIG mode (seven 1g.10gb instances) and an exclusive one; node
"shared" with an A100-80GB split in 4 shares and an exclusive one. Prices: A100 2.80/h (1g = 0.40/h)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.booking import selectors
from apps.fleet.devices import MigInstance, gpu_set_shares, mig_layout_apply
from apps.fleet.models import Gpu, GpuStatus
from apps.jobs.models import ContainerImage
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory
from workers.gpu.mig import profiles_for


@pytest.fixture(autouse=True)
def _fresh_policy() -> None:
    selectors.policy_cache_clear()


def seven_1g(parent_uuid: str) -> list[MigInstance]:
    p = profiles_for("A100-80GB")["1g.10gb"]
    return [
        MigInstance(uuid=f"MIG-{parent_uuid[4:]}-{gi}", profile=p.name, memory_mib=p.memory_mib, gi_id=gi)
        for gi in range(7, 14)
    ]


@pytest.fixture
def sharing_fleet(db: Any) -> dict[str, Any]:
    a100 = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    mig_node = NodeFactory(name="mig")
    shared_node = NodeFactory(name="shared")
    mig = GpuFactory(node=mig_node, index=0, model=a100, uuid="GPU-mig-0", mig_mode=True, status=GpuStatus.OK)
    GpuFactory(node=mig_node, index=1, model=a100, uuid="GPU-mig-1")
    mig_layout_apply(gpu=mig, mig_mode=True, instances=seven_1g(mig.uuid))
    shared = GpuFactory(node=shared_node, index=0, model=a100, uuid="GPU-shared-0")
    GpuFactory(node=shared_node, index=1, model=a100, uuid="GPU-shared-1")
    gpu_set_shares(actor=None, gpu_uuid=shared.uuid, shares=4)
    return {"model": a100, "mig": Gpu.objects.get(pk=mig.pk), "shared": Gpu.objects.get(pk=shared.pk)}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from apps.fleet import commands

    out: list[dict[str, Any]] = []
    monkeypatch.setattr(commands, "publish_command", lambda queue, task, envelope, **kw: out.append(envelope["body"]))
    return out


@pytest.fixture
def ready(sharing_fleet: dict[str, Any]) -> dict[str, Any]:
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    for gpu in Gpu.objects.all():
        gpu.node.token_digest = "d" * 64
        gpu.node.last_heartbeat = timezone.now()
        gpu.node.save(update_fields=["token_digest", "last_heartbeat"])
    return sharing_fleet
