from __future__ import annotations

import time
from typing import Any

from django.db.models import Prefetch, QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope, Team
from apps.accounts.scoping import team_ids_of
from apps.core.api.base import PortalAPIView, ScopedListAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.fleet import selectors, services
from apps.fleet.api.serializers import (
    GpuHistoryOutput,
    GpuModelOutput,
    GpuOutput,
    NodeOutput,
    ProbeRequestedOutput,
)
from apps.fleet.filtersets import GpuFilterSet
from apps.fleet.models import Gpu, GpuModel, Node
from apps.telemetry import selectors as telemetry
from apps.telemetry.keys import OUTSIDE_USE_MIB
from apps.telemetry.outside import outside_use
from apps.telemetry.publisher import share_job_readings


class GpuModelListView(ScopedListAPIView):
    """GPU models with memory, hourly price and the installation's currency."""

    model = GpuModel
    serializer_class = GpuModelOutput


def _nodes_with_gpus(qs: QuerySet[Node]) -> QuerySet[Node]:
    return qs.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.select_related("model")))


class NodeListView(ScopedListAPIView):
    """Nodes: status (online, draining, offline), last heartbeat, agent and driver versions, their GPUs."""

    model = Node
    serializer_class = NodeOutput

    def base_queryset(self) -> QuerySet[Node]:
        return _nodes_with_gpus(Node.objects.order_by("name"))


class GpuListView(ScopedListAPIView):
    """GPUs with status and latest telemetry (utilization %, memory used, temperature, power, sampled_at).

    Live figures come from Redis in one HMGET for the page; they are null for a GPU that never reported."""

    model = Gpu
    serializer_class = GpuOutput
    filter_backends = [DjangoFilterBackend]
    filterset_class = GpuFilterSet

    def base_queryset(self) -> QuerySet[Gpu]:
        live = Gpu.objects.filter(retired_at__isnull=True)
        return live.select_related("node", "model").order_by("node__name", "index")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        qs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(qs)
        rows = list(page if page is not None else qs)
        holders = selectors.gpu_holders()
        parts = selectors.gpu_parts(gpu_ids=[g.pk for g in rows if g.mig_mode or g.shares > 1])
        shared = {g.uuid: [{"uuid": p.uuid, "kind": p.kind} for p in parts.get(g.pk, [])] for g in rows if g.shares > 1}
        # What each held share's job uses now, and its SM activity: one Redis round trip for the page, not one per GPU.
        share_used, share_busy = share_job_readings(shared, holders, now=time.time()) if shared else ({}, {})
        context = {
            **self.get_serializer_context(),
            "latest": telemetry.latest_samples(g.uuid for g in rows),
            "holders": holders,
            "parts": parts,
            "share_used": share_used,
            "share_busy": share_busy,
            "team_ids": set(team_ids_of(request.user)),
            "see_all": request.user.is_staff,
        }
        context["outside"] = _outside_use(rows, context)
        if context["outside"] and not request.user.is_staff:
            context["team_slugs"] = set(Team.objects.filter(pk__in=context["team_ids"]).values_list("slug", flat=True))
        data = GpuOutput(rows, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)


def _outside_use(rows: list[Gpu], context: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The page's whole GPUs in use outside the portal (apps.telemetry.outside), as the Fleet page shows them."""
    now = time.time()
    candidates = {}
    for gpu in rows:
        sample = context["latest"].get(gpu.uuid)
        if gpu.mig_mode or gpu.shares > 1 or gpu.uuid in context["holders"] or telemetry.is_stale(sample, now=now):
            continue  # parts are listed with what their holders use; a held GPU's memory is its holder's
        used = sample.get("mem_used") if sample is not None else None
        if used is not None and used >= OUTSIDE_USE_MIB:
            candidates[gpu.uuid] = (gpu.pk, int(used))
    return outside_use(candidates, now=now)


def _visible_gpu(request: Request, uuid: str) -> Gpu:
    gpu = Gpu.objects.visible_to(request.user).filter(uuid=uuid).first()
    if gpu is None:
        raise NotFound(f"No GPU {uuid!r}.")
    return gpu


class GpuHistoryView(PortalAPIView):
    """A GPU's telemetry for its detail chart: per-minute rollups up to 48 h, per-hour beyond; `resolution=raw`
    gives the last ~2 minutes of 1 Hz samples. A GPU in MIG mode adds each instance's memory (`instances`)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("hours", OpenApiTypes.INT, description="how far back (default 24)"),
            OpenApiParameter("resolution", str, enum=["raw", "minute", "hour"], description="default: by hours"),
        ],
        responses=GpuHistoryOutput,
    )
    def get(self, request: Request, uuid: str) -> Response:
        gpu = _visible_gpu(request, uuid)
        try:
            hours = int(request.query_params.get("hours", "24"))
        except ValueError:
            hours = -1
        max_hours = 24 * 3660
        if not 1 <= hours <= max_hours:
            raise ValidationFailed("hours must be a whole number of hours.", fields={"hours": [f"1-{max_hours}."]})
        resolution = request.query_params.get("resolution") or telemetry.pick_resolution(hours)
        if resolution not in ("raw", "minute", "hour"):
            raise ValidationFailed("Unknown resolution.", fields={"resolution": ["raw, minute or hour."]})
        since = telemetry.history_window(hours)
        instances: list[dict[str, Any]] = []
        if resolution == "raw":
            points: list[dict[str, Any]] = telemetry.raw_history(gpu.uuid)
        else:
            points = telemetry.rollup_history(gpu_id=gpu.pk, since=since, resolution=resolution)
            if gpu.mig_mode:
                instances = telemetry.instance_history(gpu_id=gpu.pk, since=since, resolution=resolution)
        out = {"uuid": gpu.uuid, "resolution": resolution, "since": since, "points": points, "instances": instances}
        return Response(GpuHistoryOutput(out).data)


class NodeDrainView(PortalAPIView):
    """Drain a node (admin): it stays up, no new work is placed on it. Idempotent."""

    write_scope = Scope.ADMIN
    draining = True

    @extend_schema(request=None, responses=NodeOutput)
    def post(self, request: Request, name: str) -> Response:
        services.node_drain(actor=request.user, node_name=name, draining=self.draining)
        node = _nodes_with_gpus(Node.objects.filter(name=name)).get()
        return Response(NodeOutput(node).data)


class NodeUndrainView(NodeDrainView):
    """Undrain a node (admin): it takes work again once online. Idempotent."""

    draining = False


class GpuProbeView(PortalAPIView):
    """Ask the GPU's agent to run the health probe (admin); the verdict lands on the GPU (`probe_verdict`) and a
    degraded one marks it `degraded`."""

    write_scope = Scope.ADMIN

    @extend_schema(request=None, responses={202: ProbeRequestedOutput})
    def post(self, request: Request, uuid: str) -> Response:
        gpu = services.gpu_probe_request(actor=request.user, gpu_uuid=uuid)
        body = {"gpu": gpu.uuid, "node": gpu.node.name, "status": "requested"}
        return Response(ProbeRequestedOutput(body).data, status=status.HTTP_202_ACCEPTED)
