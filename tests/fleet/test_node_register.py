"""node_register: idempotent by uuid, re-indexing, retiring, and no taking over another node's GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from apps.audit.models import AuditEvent
from apps.fleet import services
from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus
from tests.fleet.util import gpu_reports, registered_node

pytestmark = pytest.mark.django_db


def test_registration_creates_gpus_models_and_brings_the_node_online() -> None:
    node, _ = registered_node("n1", ("A100-80GB", "H100-80GB"))
    assert node.status == NodeStatus.ONLINE
    assert node.last_heartbeat is not None and node.registered_at is not None
    gpus = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", "index", "model__name", "status"))
    assert gpus == [("GPU-n1-0", 0, "A100-80GB", "ok"), ("GPU-n1-1", 1, "H100-80GB", "ok")]
    assert GpuModel.objects.filter(name="H100-80GB").exists()
    assert AuditEvent.objects.filter(action="node.register", target_id=str(node.pk)).exists()


def test_registering_again_changes_nothing() -> None:
    node, _ = registered_node("n1")
    ids = dict(Gpu.objects.values_list("uuid", "id"))
    for _ in range(3):
        services.node_register(node_id=node.pk, gpus=gpu_reports("n1"))
    assert dict(Gpu.objects.values_list("uuid", "id")) == ids
    assert Gpu.objects.count() == 2


def test_an_existing_gpu_model_is_reused_with_its_price() -> None:
    GpuModel.objects.create(name="A100-80GB", memory_mib=81920, hourly_price="2.5")
    registered_node("n1", ("A100-80GB",))
    assert GpuModel.objects.get(name="A100-80GB").hourly_price == 2.5


def test_swapped_indexes_are_updated_in_place() -> None:
    node, _ = registered_node("n1", ("A100-80GB", "H100-80GB"))
    a, b = gpu_reports("n1", ("A100-80GB", "H100-80GB"))
    services.node_register(node_id=node.pk, gpus=[dataclasses.replace(a, index=1), dataclasses.replace(b, index=0)])
    assert dict(Gpu.objects.values_list("uuid", "index")) == {"GPU-n1-0": 1, "GPU-n1-1": 0}
    assert Gpu.objects.filter(retired_at__isnull=False).count() == 0


def test_a_gpu_that_disappears_is_retired_and_its_slot_reusable() -> None:
    node, _ = registered_node("n1", ("A100-80GB", "H100-80GB"))
    a, _b = gpu_reports("n1")
    services.node_register(node_id=node.pk, gpus=[a])
    gone = Gpu.objects.get(uuid="GPU-n1-1")
    assert gone.retired_at is not None and gone.status == GpuStatus.LOST
    new = dataclasses.replace(a, uuid="GPU-new", index=1)
    services.node_register(node_id=node.pk, gpus=[a, new])
    assert Gpu.objects.get(uuid="GPU-new").index == 1
    assert Gpu.objects.filter(node=node, retired_at__isnull=True).count() == 2


def test_a_node_cannot_take_over_another_nodes_gpu() -> None:
    registered_node("n1")
    n2, _ = registered_node("n2", ("A100-80GB",))
    stolen = gpu_reports("n1")[0]
    services.node_register(
        node_id=n2.pk, gpus=[*gpu_reports("n2", ("A100-80GB",)), dataclasses.replace(stolen, index=1)]
    )
    assert Gpu.objects.get(uuid=stolen.uuid).node.name == "n1"
    assert Gpu.objects.filter(node=n2).count() == 1


def test_registration_of_a_draining_node_keeps_it_draining(admin) -> None:
    node, _ = registered_node("n1")
    services.node_drain(actor=admin, node_name="n1")
    services.node_register(node_id=node.pk, gpus=gpu_reports("n1"))
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING and node.draining


def test_node_token_issue_rotates_the_token() -> None:
    node, first = services.node_token_issue(node_name="n1")
    _, second = services.node_token_issue(node_name="n1")
    assert first != second and first.startswith("gpn_")
    node.refresh_from_db()
    assert Node.objects.count() == 1
    from apps.accounts import tokens

    assert tokens.digest_of(second) == node.token_digest
    assert node.token_prefix in second


def test_a_bad_node_name_is_refused() -> None:
    from apps.core.errors import ValidationFailed

    with pytest.raises(ValidationFailed):
        services.node_token_issue(node_name="no spaces please")
