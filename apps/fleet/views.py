"""Fleet pages: the live Fleet page and a GPU's detail page.

Both are rendered with their initial state as JSON in the page, so they are useful before the first websocket
message; after that `/ws/fleet/` keeps them live (frontend/src/pages/fleet.js, gpu.js).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.types import AnyUser
from apps.core.errors import NotFound
from apps.fleet import selectors, services
from apps.fleet.devices import MAX_SHARES
from apps.fleet.models import Gpu
from apps.telemetry import keys
from apps.telemetry import selectors as telemetry
from apps.telemetry.fanout import Snapshot, Viewer, last_snapshot_document, viewer_for
from apps.telemetry.publisher import add_parts, parts_by_uuid, share_job_readings

SPARK_POINTS = 60  # seconds of utilization history drawn in a row's sparkline


def _snapshot_from_database(*, user: AnyUser, viewer: Viewer) -> dict[str, Any]:
    """The snapshot shape built from the database and the latest samples, for when no publisher is running (or
    Redis was just restarted): the page still lists every node and GPU, with figures where there are any."""
    gpus = list(selectors.gpus_visible_to(user=user))
    latest = telemetry.latest_samples(g.uuid for g in gpus)
    holders = selectors.gpu_holders()
    parts = parts_by_uuid({g.pk: g.uuid for g in gpus if g.mig_mode or g.shares > 1})
    now = time.time()
    share_used, share_busy = share_job_readings(parts, holders, now=now)
    rows = []
    for gpu in gpus:
        sample: dict[str, Any] = dict(latest.get(gpu.uuid) or {})
        rows.append(
            {
                "uuid": gpu.uuid,
                "node": gpu.node.name,
                "index": gpu.index,
                "model": gpu.model.name,
                **{k: sample.get(k) for k in ("util", "mem_used", "temp", "power", "sm_clock", "tensor", "ts")},
                "mem_total": sample.get("mem_total") or gpu.memory_mib,
                "status": gpu.status,
                "node_status": gpu.node.status,
                "stale": telemetry.is_stale(latest.get(gpu.uuid), now=now),
                "holder": holders.get(gpu.uuid),
            }
        )
        if gpu.uuid in parts:  # its MIG instances or shares, as the publisher lists them
            add_parts(rows[-1], parts[gpu.uuid], holders, latest.get(gpu.uuid), share_used, share_busy)
    nodes = [
        {"name": n.name, "status": n.status, "last_heartbeat": n.last_heartbeat and n.last_heartbeat.isoformat()}
        for n in selectors.nodes_visible_to(user=user)
    ]
    doc = {"type": "fleet", "ts": datetime.now(UTC).isoformat(), "seq": None, "gpus": rows, "nodes": nodes}
    # Through the same redaction as the websocket, so the first paint shows exactly what the stream will.
    return Snapshot(doc).document_for(viewer)


def _utilization_history(uuids: list[str]) -> dict[str, list[int | None]]:
    """The last SPARK_POINTS utilization samples of each GPU (oldest first), in one pipelined round trip."""
    if not uuids:
        return {}
    from apps.core.redis import get_redis

    try:
        pipe = get_redis().pipeline(transaction=False)
        for uuid in uuids:
            pipe.lrange(keys.hist_key(uuid), 0, SPARK_POINTS - 1)
        lists = pipe.execute()
    except Exception:  # Redis down: sparklines start empty and fill from the websocket
        return {}
    return {uuid: [p["util"] for p in keys.decode_hist(items)] for uuid, items in zip(uuids, lists, strict=True)}


@login_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    viewer = viewer_for(request.user)
    snapshot = last_snapshot_document(viewer=viewer) or _snapshot_from_database(user=request.user, viewer=viewer)
    history = _utilization_history([g["uuid"] for g in snapshot["gpus"]])
    initial = {"snapshot": snapshot, "history": history, "spark_points": SPARK_POINTS}
    # Admins drain and undrain nodes here, as in Django admin and the API (the same service, audited).
    nodes = list(selectors.nodes_visible_to(user=request.user).order_by("name")) if request.user.is_staff else []
    return render(request, "fleet/fleet.html", {"initial": initial, "admin_nodes": nodes})


@login_required
@require_POST
def node_drain(request: HttpRequest, name: str, draining: bool) -> HttpResponse:
    """Drain (or undrain) a node from the Fleet page (admins): the scheduler places no new work on a draining
    node; what runs there keeps running."""
    if not request.user.is_staff:
        raise PermissionDenied("Only administrators drain nodes.")
    try:
        node = services.node_drain(actor=request.user, node_name=name, draining=draining)
    except NotFound:
        raise Http404("No such node.") from None
    if draining:
        messages.success(request, f"Node “{node.name}” is draining: no new work is placed on it.")
    else:
        messages.success(request, f"Node “{node.name}” takes work again.")
    return redirect("fleet:index")


def _probe_rows(probe: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Measured figure, spec and ratio per probe figure, for the detail page's table."""
    if not probe or ("error" in probe and "comparison" not in probe):
        return []
    labels = {
        "fp32_tflops": "FP32 matmul (TFLOPS)",
        "fp16_tflops": "FP16 matmul (TFLOPS)",
        "bf16_tflops": "BF16 matmul (TFLOPS)",
        "bandwidth_gbs": "Memory bandwidth (GB/s)",
    }
    spec = probe.get("spec") or {}
    ratios = probe.get("ratios") or {}
    below = set(probe.get("below") or ())
    return [
        {
            "label": label,
            "measured": probe.get(key),
            "spec": spec.get(key),
            "ratio": ratios.get(key),
            "below": key in below,
        }
        for key, label in labels.items()
        if probe.get(key) is not None
    ]


@login_required
def gpu_page(request: HttpRequest, uuid: str) -> HttpResponse:
    gpu: Gpu | None = selectors.gpus_visible_to(user=request.user).filter(uuid=uuid).first()
    if gpu is None:
        raise Http404("No such GPU.")
    viewer = viewer_for(request.user)
    snapshot = last_snapshot_document(viewer=viewer)
    live = next((g for g in snapshot["gpus"] if g["uuid"] == uuid), None) if snapshot else None
    config = {
        "uuid": gpu.uuid,
        "node": gpu.node.name,
        "index": gpu.index,
        "model": gpu.model.name,
        "memory_mib": gpu.memory_mib,
        "live": live,
        "history_url": f"/api/v1/gpus/{gpu.uuid}/history/",
        "probe_url": f"/api/v1/gpus/{gpu.uuid}/probe/" if request.user.is_staff else None,
        # Admins split a GPU outside MIG mode in shares (a GPU in MIG mode is split by its instances).
        "shares_url": f"/api/v1/gpus/{gpu.uuid}/shares/" if request.user.is_staff and not gpu.mig_mode else None,
    }
    # Its MIG instances or shares, one row each; who holds them and what they use come live from the snapshot.
    parts = selectors.gpu_parts(gpu_ids=[gpu.pk]).get(gpu.pk, [])
    part_rows = [
        {
            "uuid": p.uuid,
            "label": selectors.part_label(p, len(parts)),
            "memory_mib": p.memory_mib,
            "memory_gib": f"{p.memory_mib / 1024:.1f}",
            "gi_id": p.gi_id,
        }
        for p in parts
    ]
    # Compute instances of one GPU instance share its memory: each row shows the GPU instance's figures.
    by_gi: dict[int, list[str]] = {}
    for row in part_rows:
        if gpu.mig_mode and row["gi_id"] is not None:
            by_gi.setdefault(int(str(row["gi_id"])), []).append(str(row["label"]))
    shared_gis = [{"gi_id": gi, "labels": labels} for gi, labels in sorted(by_gi.items()) if len(labels) > 1]
    probe = gpu.probe if isinstance(gpu.probe, dict) else None
    return render(
        request,
        "fleet/gpu.html",
        {
            "gpu": gpu,
            "config": config,
            "parts": part_rows,
            "shared_gis": shared_gis,
            "probe": probe,
            "probe_rows": _probe_rows(probe),
            "probe_error": probe.get("error") if probe and "comparison" not in probe else None,
            "share_choices": range(1, MAX_SHARES + 1),
        },
    )
