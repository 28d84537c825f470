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


SHARED_INDEX = 2
SHARED_IN = 4


def local_specs() -> list[str]:
    """What the launcher's simulated local agent is given for each GPU, by index: a model key, with a MIG layout
    for the GPU in MIG mode ("A100-80GB:mig=1g.10gb*7")."""
    from portal.launcher import LOCAL_AGENT_MODELS

    return LOCAL_AGENT_MODELS.split(",")


def local_models() -> list[str]:
    """The model key of each GPU the launcher's simulated local agent registers, by index."""
    return [spec.partition(":")[0] for spec in local_specs()]


def placeholder_gpus() -> list[Gpu]:
    """The live GPUs; without any, the local agent's future ones (created offline, price 0 until booking's demo
    or an admin prices their models)."""
    from apps.fleet.devices import gpu_set_shares, mig_layout_apply
    from workers.gpu.mig import simulated_mig_devices, split_model_spec
    from workers.gpu.simulated import simulated_uuid
    from workers.gpu.specs import get_spec

    if Gpu.objects.filter(retired_at__isnull=True).exists():
        return []
    with transaction.atomic():
        node, _ = Node.objects.get_or_create(name=LOCAL_NODE, defaults={"status": NodeStatus.OFFLINE})
        for index, full in enumerate(local_specs()):
            key, layout = split_model_spec(full)
            spec = get_spec(key)
            model, _ = GpuModel.objects.get_or_create(
                name=spec.key, defaults={"display_name": spec.marketing_name, "memory_mib": spec.memory_mib}
            )
            gpu, _ = Gpu.objects.get_or_create(
                uuid=simulated_uuid(LOCAL_NODE, index, 0),
                defaults={
                    "node": node,
                    "index": index,
                    "model": model,
                    "name": spec.nvml_names[0],
                    "memory_mib": spec.memory_mib,
                    "status": GpuStatus.OFFLINE,
                    "mig_mode": bool(layout),
                },
            )
            if layout:  # the instances the agent will report (same uuids: derived from the GPU's)
                mig_layout_apply(
                    gpu=gpu, mig_mode=True, instances=list(simulated_mig_devices(gpu.uuid, spec.key, layout))
                )
            elif index == SHARED_INDEX:
                gpu_set_shares(actor=None, gpu_uuid=gpu.uuid, shares=SHARED_IN)
    return list(Gpu.objects.filter(node=node, retired_at__isnull=True).select_related("model").order_by("index"))


def load() -> None:
    placeholder_gpus()
