"""Reads for the fleet."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus


def gpu_models_visible_to(*, user: Any) -> QuerySet[GpuModel]:
    return GpuModel.objects.visible_to(user).order_by("name")


def nodes_visible_to(*, user: Any) -> QuerySet[Node]:
    return Node.objects.visible_to(user).prefetch_related("gpus__model").order_by("name")


def fleet_summary(*, user: Any) -> dict[str, Any]:
    """Counts for the home page."""
    nodes = Node.objects.visible_to(user).aggregate(
        total=Count("id"), online=Count("id", filter=Q(status=NodeStatus.ONLINE))
    )
    gpus = Gpu.objects.visible_to(user).aggregate(
        total=Count("id"), ok=Count("id", filter=Q(status=GpuStatus.OK, node__status=NodeStatus.ONLINE))
    )
    return {"nodes": nodes["total"], "nodes_online": nodes["online"], "gpus": gpus["total"], "gpus_ok": gpus["ok"]}
