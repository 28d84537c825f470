"""Demo fleet (embedded default only): before the local node agent has ever registered, the GPUs it will register,
so the other apps' demo data (usage history, reservations, jobs) can sit on them from the first start.

They are the launcher's simulated local agent's GPUs exactly: node "local", the models of
portal.launcher.LOCAL_AGENT_MODELS in that order, the simulator's stable uuids (seed 0). Registration adopts them by
uuid with the same model, so the history's models are the fleet's models. On a node with real GPUs they are
retired on registration and keep the history. Nothing is created once any live GPU exists.
"""

from __future__ import annotations

from django.db import transaction

from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus

LOCAL_NODE = "local"


def local_models() -> list[str]:
    """The model key of each GPU the launcher's simulated local agent registers, by index."""
    from portal.launcher import LOCAL_AGENT_MODELS

    return LOCAL_AGENT_MODELS.split(",")


def placeholder_gpus() -> list[Gpu]:
    """The live GPUs; without any, the local agent's future ones (created offline, price 0 until booking's demo
    or an admin prices their models)."""
    from workers.gpu.simulated import simulated_uuid
    from workers.gpu.specs import get_spec

    if Gpu.objects.filter(retired_at__isnull=True).exists():
        return []
    with transaction.atomic():
        node, _ = Node.objects.get_or_create(name=LOCAL_NODE, defaults={"status": NodeStatus.OFFLINE})
        for index, key in enumerate(local_models()):
            spec = get_spec(key)
            model, _ = GpuModel.objects.get_or_create(
                name=spec.key, defaults={"display_name": spec.marketing_name, "memory_mib": spec.memory_mib}
            )
            Gpu.objects.get_or_create(
                uuid=simulated_uuid(LOCAL_NODE, index, 0),
                defaults={
                    "node": node,
                    "index": index,
                    "model": model,
                    "name": spec.nvml_names[0],
                    "memory_mib": spec.memory_mib,
                    "status": GpuStatus.OFFLINE,
                },
            )
    return list(Gpu.objects.filter(node=node, retired_at__isnull=True).select_related("model").order_by("index"))


def load() -> None:
    placeholder_gpus()
