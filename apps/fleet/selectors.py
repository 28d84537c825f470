"""Reads for the fleet."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from apps.accounts.types import AnyUser
from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus


def gpu_models_visible_to(*, user: AnyUser) -> QuerySet[GpuModel]:
    return GpuModel.objects.visible_to(user).order_by("name")


def nodes_visible_to(*, user: AnyUser) -> QuerySet[Node]:
    return Node.objects.visible_to(user).prefetch_related("gpus__model").order_by("name")


def fleet_summary(*, user: AnyUser) -> dict[str, Any]:
    """Counts for the home page."""
    nodes = Node.objects.visible_to(user).aggregate(
        total=Count("id"), online=Count("id", filter=Q(status=NodeStatus.ONLINE))
    )
    gpus = Gpu.objects.visible_to(user).aggregate(
        total=Count("id"), ok=Count("id", filter=Q(status=GpuStatus.OK, node__status=NodeStatus.ONLINE))
    )
    return {"nodes": nodes["total"], "nodes_online": nodes["online"], "gpus": gpus["total"], "gpus_ok": gpus["ok"]}


def gpus_visible_to(*, user: AnyUser) -> QuerySet[Gpu]:
    """Live (not retired) GPUs with their node and model, in node/index order."""
    return (
        Gpu.objects.visible_to(user)
        .filter(retired_at__isnull=True)
        .select_related("node", "model")
        .order_by("node__name", "index")
    )


def gpu_holders() -> dict[str, dict[str, Any]]:
    """Who holds each GPU right now: {gpu uuid: {"kind": "reservation" | "job", "id", "team", "team_id", "user",
    "until"}} (apps.telemetry.keys.Holder). The fleet publisher and the GPU API merge it in.

    A hook: booking and jobs fill it (active reservations, running jobs) by replacing this body; until then nobody
    holds anything as far as the fleet view knows. Called once a second by the publisher, so keep it to a query
    or two."""
    return {}
