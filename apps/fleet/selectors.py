"""Reads for the fleet."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.types import AnyUser
from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus


def gpu_models_visible_to(*, user: AnyUser) -> QuerySet[GpuModel]:
    return GpuModel.objects.visible_to(user).order_by("name")


def nodes_visible_to(*, user: AnyUser) -> QuerySet[Node]:
    return Node.objects.visible_to(user).prefetch_related("gpus__model").order_by("name")


def fleet_summary(*, user: AnyUser) -> dict[str, Any]:
    """Counts for the home page, as the Fleet page counts them: live GPUs; those in service (ok, on a node online);
    of those, the ones free now (nothing holds the GPU or any of its MIG instances or shares: a GPU partly held
    counts as busy, as on the Fleet page)."""
    from apps.booking.models import Allocation

    now = timezone.now()
    nodes = Node.objects.visible_to(user).aggregate(
        total=Count("id"), online=Count("id", filter=Q(status=NodeStatus.ONLINE))
    )
    held = (
        Allocation.objects.active()
        .filter(start__lte=now, end__gt=now)
        .annotate(physical=Coalesce("gpu__parent_id", "gpu_id"))
        .values("physical")
    )
    in_service = Q(status=GpuStatus.OK, node__status=NodeStatus.ONLINE)
    gpus = (
        Gpu.objects.visible_to(user)
        .filter(retired_at__isnull=True)
        .aggregate(
            total=Count("id"),
            ok=Count("id", filter=in_service),
            free=Count("id", filter=in_service & ~Q(pk__in=held)),
        )
    )
    return {
        "nodes": nodes["total"],
        "nodes_online": nodes["online"],
        "gpus": gpus["total"],
        "gpus_ok": gpus["ok"],
        "gpus_free": gpus["free"],
    }


def gpus_visible_to(*, user: AnyUser) -> QuerySet[Gpu]:
    """Live (not retired) GPUs with their node and model, in node/index order."""
    return (
        Gpu.objects.visible_to(user)
        .filter(retired_at__isnull=True)
        .select_related("node", "model")
        .order_by("node__name", "index")
    )


def gpu_parts(*, gpu_ids: list[int] | None = None) -> dict[int, list[Gpu]]:
    """The live MIG instances and shares of GPUs (all, or of `gpu_ids`), by physical GPU id, in index order."""
    qs = Gpu.devices.filter(parent__isnull=False, retired_at__isnull=True)
    if gpu_ids is not None:
        qs = qs.filter(parent_id__in=gpu_ids)
    out: dict[int, list[Gpu]] = {}
    for part in qs.order_by("parent_id", "kind", "index"):
        assert part.parent_id is not None
        out.setdefault(part.parent_id, []).append(part)
    return out


def part_label(part: Gpu, shares: int) -> str:
    """How pages name a part: its MIG profile ("1g.10gb"), or "share 2/4" for the second of four shares."""
    return part.part_label(shares)


def gpu_holders() -> dict[str, dict[str, Any]]:
    """Who holds each GPU right now: {gpu uuid: {"kind": "reservation" | "job", "id", "team", "team_id", "user",
    "until"}} (apps.telemetry.keys.Holder), from the active allocations whose window contains now. A job that runs
    inside a reservation has no allocation of its own: the reservation is the holder. The fleet publisher calls it
    once a second and the GPU API and Fleet page merge it in: one query on the active-allocation index."""
    from apps.booking.models import Allocation, AllocationKind

    now = timezone.now()
    rows = (
        Allocation.objects.active()
        .filter(start__lte=now, end__gt=now)
        .values_list("gpu__uuid", "kind", "reservation_id", "job_id", "team_id", "team__slug", "user__username", "end")
    )
    holders: dict[str, dict[str, Any]] = {}
    for uuid, kind, reservation_id, job_id, team_id, team, user, end in rows:
        holders[uuid] = {
            "kind": kind,
            "id": reservation_id if kind == AllocationKind.RESERVATION else job_id,
            "team": team,
            "team_id": team_id,
            "user": user or "",
            "until": end.isoformat(),
        }
    return holders


_RELEASED_SQL = """
SELECT DISTINCT coalesce(g.parent_id, g.id) FROM booking_allocation a JOIN fleet_gpu g ON g.id = a.gpu_id
WHERE a."end" > %s AND a."end" <= %s AND (g.id = ANY(%s) OR g.parent_id = ANY(%s))"""


def released_within(gpu_ids: Iterable[int], *, seconds: float, now: datetime | None = None) -> set[int]:
    """Of these GPUs (whole ones), those the portal released in the last `seconds`: an allocation on the GPU or on one
    of its parts (a MIG instance, a share) ended then. What telemetry shows there may still be the work that just
    ended (keys.OUTSIDE_GRACE_S). One query; the ids go as one array parameter, not a list of thousands (the fleet
    publisher asks for every GPU in use outside the portal, once a second)."""
    ids = list(gpu_ids)
    if not ids:
        return set()
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_RELEASED_SQL, [now - timedelta(seconds=seconds), now, ids, ids])
        return {int(row[0]) for row in cursor.fetchall()}
