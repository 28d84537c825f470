"""Writes for the fleet: node tokens, registration, heartbeats, liveness, draining, probes.

State of a node, in one place (`_node_transition`): `online` while it heartbeats, `draining` while it heartbeats
and an admin drains it, `offline` when its last heartbeat is older than FLEET_HEARTBEAT_TIMEOUT_S. Its GPUs follow:
`offline` with the node, back to `ok` (or `degraded`, when the last probe said so) when it returns.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts import tokens
from apps.accounts.types import AnyUser
from apps.audit.services import audit_record
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.events.services import publish
from apps.fleet import auth
from apps.fleet.commands import agent_send
from apps.fleet.devices import mig_layout_apply
from apps.fleet.hooks import LayoutChange, gpus_lost, layout_changed, layout_lock
from apps.fleet.messages import NODE_NAME_RE, GpuReport, MessageRejected
from apps.fleet.models import DeviceKind, Gpu, GpuModel, GpuStatus, Node, NodeStatus

logger = logging.getLogger(__name__)

# Legal node status moves. Every status may go to offline (missed heartbeats); coming back goes through the
# heartbeat or registration, which picks online or draining from `draining`.
_NODE_MOVES: dict[str, set[str]] = {
    NodeStatus.OFFLINE: {NodeStatus.ONLINE, NodeStatus.DRAINING},
    NodeStatus.ONLINE: {NodeStatus.OFFLINE, NodeStatus.DRAINING},
    NodeStatus.DRAINING: {NodeStatus.OFFLINE, NodeStatus.ONLINE},
}


def _live_status(node: Node) -> str:
    return NodeStatus.DRAINING if node.draining else NodeStatus.ONLINE


def _gpu_status_when_up(gpu: Gpu) -> str:
    if gpu.probe and gpu.probe.get("degraded") is True:
        return GpuStatus.DEGRADED
    return GpuStatus.OK


def _node_transition(*, node: Node, to: str, actor: AnyUser | None, reason: str) -> bool:
    """Move a locked node (select_for_update by the caller) to `to`, with its GPUs and an audit entry.

    Returns False when it already is there; raises Conflict for a move the table above does not allow."""
    if node.status == to:
        return False
    if to not in _NODE_MOVES[node.status]:
        raise Conflict(f"Node {node.name} cannot go from {node.status} to {to}.")
    previous = node.status
    node.status = to
    node.save(update_fields=["status"])
    gpus = Gpu.objects.select_for_update().filter(node=node, retired_at__isnull=True)
    if to == NodeStatus.OFFLINE:
        gpus.exclude(status=GpuStatus.LOST).update(status=GpuStatus.OFFLINE)
    elif previous == NodeStatus.OFFLINE:
        for gpu in gpus.filter(status=GpuStatus.OFFLINE):
            gpu.status = _gpu_status_when_up(gpu)
            gpu.save(update_fields=["status"])
    audit_record(actor=actor, action=f"node.{to}", target=node, data={"from": previous, "reason": reason})
    if NodeStatus.OFFLINE in (to, previous):  # fleet-wide events: every team's webhooks may ask for them
        kind = "node.down" if to == NodeStatus.OFFLINE else "node.up"
        data: dict[str, object] = {"node": node.name, "status": to, "reason": reason}
        publish(kind, team_id=None, subject=f"nodes/{node.name}", data=data)
    return True


# --- Tokens ---------------------------------------------------------------------------------------------------


def node_token_issue(*, node_name: str, actor: AnyUser | None = None) -> tuple[Node, str]:
    """Create the node if needed and give it a new token (the old one stops working); returns (node, plaintext).

    The plaintext is shown once; the node stores it (GPUPORTAL_NODE_TOKEN) and sends it with every message."""
    if not NODE_NAME_RE.match(node_name or ""):
        raise ValidationFailed(
            "A node name is 1-100 letters, digits, dots, dashes or underscores.",
            fields={"name": ["1-100 of A-Z a-z 0-9 . _ -, starting with a letter or digit."]},
        )
    plaintext, prefix, digest = tokens.generate(auth.NODE_TOKEN_KIND)
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(name=node_name)
        node.token_prefix = prefix
        node.token_digest = digest
        node.token_created_at = timezone.now()
        node.save(update_fields=["token_prefix", "token_digest", "token_created_at"])
        audit_record(actor=actor, action="node.token_issue", target=node, data={"created": created, "prefix": prefix})
    transaction.on_commit(lambda: auth.forget(node_name))
    return node, plaintext


# --- Agent reports --------------------------------------------------------------------------------------------


def node_register(
    *,
    node_id: int,
    gpus: list[GpuReport],
    agent_version: str = "",
    driver_version: str = "",
    hostname: str = "",
    backend: str = "",
    now: datetime | None = None,
) -> Node:
    """Record what the agent found on its node. Idempotent: the same GPUs (by uuid) map to the same rows.

    Holds the node's row lock, and the GPU rows' locks, for the whole update. A GPU the agent no longer reports is
    retired (kept for history); a reported uuid that belongs to a live GPU of another node is refused, so a node
    cannot take over another's GPUs."""
    now = now or timezone.now()
    # A registration that changes a MIG layout changes what bookings and the scheduler hold: the layout guard's
    # locks come first (hooks.py). Whether it will is read before the transaction; a registration of the same node
    # that changed the layout meanwhile is caught inside and this one done again, guarded.
    guarded = _layout_may_change(node_id, gpus)
    try:
        return _node_register(node_id, gpus, agent_version, driver_version, hostname, backend, now, guarded)
    except _GuardNeeded:
        return _node_register(node_id, gpus, agent_version, driver_version, hostname, backend, now, True)


class _GuardNeeded(Exception):
    pass


def _layout_may_change(node_id: int, gpus: list[GpuReport]) -> bool:
    """Whether the report's MIG layout differs from the node's as recorded, or a GPU it had is missing from it
    (one query; a second only where a GPU is or was in MIG mode)."""
    reported = {g.uuid: (g.mig_mode, frozenset(d.uuid for d in g.mig_devices)) for g in gpus}
    rows = Gpu.objects.filter(node_id=node_id, retired_at__isnull=True).values_list("uuid", "mig_mode")
    recorded: dict[str, tuple[bool, set[str]]] = {uuid: (mig, set()) for uuid, mig in rows}
    if set(recorded) - set(reported):
        return True
    if not any(mig for mig, _ in reported.values()) and not any(mig for mig, _ in recorded.values()):
        return False
    parts = Gpu.devices.filter(parent__node_id=node_id, kind=DeviceKind.MIG, retired_at__isnull=True)
    for parent_uuid, uuid in parts.values_list("parent__uuid", "uuid"):
        if parent_uuid in recorded:
            recorded[parent_uuid][1].add(uuid)
    for uuid, (mig, devices) in reported.items():
        was_mig, was_devices = recorded.get(uuid, (False, set()))
        if (mig or was_mig) and (mig, devices) != (was_mig, frozenset(was_devices)):
            return True
    return False


def _node_register(
    node_id: int,
    gpus: list[GpuReport],
    agent_version: str,
    driver_version: str,
    hostname: str,
    backend: str,
    now: datetime,
    guarded: bool,
) -> Node:
    with transaction.atomic():
        if guarded:
            layout_lock()
        node = Node.objects.select_for_update().get(pk=node_id)
        reported = {g.uuid: g for g in gpus}
        taken = set(
            Gpu.objects.filter(uuid__in=reported, retired_at__isnull=True)
            .exclude(node=node)
            .values_list("uuid", flat=True)
        )
        for uuid in sorted(taken):
            logger.warning("node %s reported GPU %s, which belongs to another node; ignored", node.name, uuid)
            reported.pop(uuid)
        existing = {g.uuid: g for g in Gpu.objects.select_for_update().filter(uuid__in=reported)}
        had_mig = {g.pk for g in existing.values() if g.mig_mode}
        mine = list(Gpu.objects.select_for_update().filter(node=node, retired_at__isnull=True))
        # Step 1: every live row of this node whose slot changes or that vanished leaves the (node, index)
        # uniqueness (retired), so step 2 can put GPUs in any order of slots, swaps included.
        retired: list[str] = []
        for gpu in mine:
            report = reported.get(gpu.uuid)
            if report is None or report.index != gpu.index:
                gpu.retired_at = now
                gpu.save(update_fields=["retired_at"])
                if report is None:
                    retired.append(gpu.uuid)
        models = _models_for(list(reported.values()))
        created: list[str] = []
        live_status = _live_status(node)
        layouts: list[tuple[Gpu, GpuReport]] = []
        for report in reported.values():
            found = existing.get(report.uuid)
            fields = {
                "node": node,
                "index": report.index,
                "model": models[report.model],
                "memory_mib": report.memory_mib,
                "mig_mode": report.mig_mode,
                "name": report.name,
                "retired_at": None,
            }
            if found is None:
                gpu = Gpu(uuid=report.uuid, status=GpuStatus.OK, **fields)
                gpu.save()
                created.append(report.uuid)
            else:
                gpu = found
                for key, value in fields.items():
                    setattr(gpu, key, value)
                if gpu.status in (GpuStatus.OFFLINE, GpuStatus.LOST):
                    gpu.status = _gpu_status_when_up(gpu)
                gpu.save()
            if report.mig_mode or (found is not None and found.pk in had_mig):
                layouts.append((gpu, report))
        retired_parts, into_mig = _layouts_apply(node_id, layouts, had_mig, now) if layouts else ((), ())
        gone = tuple(sorted(g.pk for g in mine if g.uuid in retired))
        if retired:
            Gpu.objects.filter(uuid__in=retired).update(status=GpuStatus.LOST)
        if retired_parts or into_mig or gone:
            if not guarded:
                raise _GuardNeeded
            layout_changed(LayoutChange(node_id=node_id, retired=retired_parts, into_mig=into_mig, gone=gone))
        node.agent_version = agent_version
        node.driver_version = driver_version
        node.hostname = hostname
        node.backend = backend
        node.registered_at = now
        node.last_heartbeat = now
        node.last_seen = now
        node.save(
            update_fields=[
                "agent_version",
                "driver_version",
                "hostname",
                "backend",
                "registered_at",
                "last_heartbeat",
                "last_seen",
            ]
        )
        _node_transition(node=node, to=live_status, actor=None, reason="registered")
        audit_record(
            actor=None,
            action="node.register",
            target=node,
            data={"gpus": len(reported), "new": created, "retired": retired, "refused": sorted(taken)},
        )
    transaction.on_commit(lambda: auth.forget(node.name))
    return node


def _models_for(reports: list[GpuReport]) -> dict[str, GpuModel]:
    """GpuModel rows by name, created on first sight (price 0 until an admin sets it). Booking's demo creates the
    same names with get_or_create, so either side may come first."""
    out: dict[str, GpuModel] = {}
    for report in reports:
        if report.model not in out:
            out[report.model], _ = GpuModel.objects.get_or_create(
                name=report.model, defaults={"memory_mib": report.memory_mib, "display_name": report.name}
            )
    return out


def _layouts_apply(
    node_id: int, layouts: list[tuple[Gpu, GpuReport]], had_mig: set[int], now: datetime
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The MIG instances as the agent found them (admins change layouts with mig-parted; the portal follows).
    Returns what that took away from bookings and the scheduler: the parts retired and the GPUs that entered MIG
    mode."""
    parents = [gpu.pk for gpu, _ in layouts]
    live = Gpu.devices.filter(parent_id__in=parents, kind=DeviceKind.MIG, retired_at__isnull=True)
    before = set(live.values_list("pk", flat=True))
    for gpu, report in layouts:
        mig_layout_apply(gpu=gpu, mig_mode=report.mig_mode, instances=list(report.mig_devices), now=now)
    retired = tuple(sorted(before - set(live.values_list("pk", flat=True))))
    into_mig = tuple(gpu.pk for gpu, report in layouts if report.mig_mode and gpu.pk not in had_mig)
    return retired, into_mig


def node_heartbeat(*, node_id: int, agent_version: str = "", now: datetime | None = None) -> str:
    """The node is alive: stamp it, and bring it back if it was offline. Returns the node's status.

    The common case is one conditional UPDATE without a lock; only a node coming back takes the row lock."""
    now = now or timezone.now()
    updated = (
        Node.objects.filter(pk=node_id).exclude(status=NodeStatus.OFFLINE).update(last_heartbeat=now, last_seen=now)
    )
    if updated:
        return str(Node.objects.values_list("status", flat=True).get(pk=node_id))
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        node.last_heartbeat = now
        node.last_seen = now
        if agent_version:
            node.agent_version = agent_version
        node.save(update_fields=["last_heartbeat", "last_seen", "agent_version"])
        _node_transition(node=node, to=_live_status(node), actor=None, reason="heartbeat")
    return str(node.status)


def nodes_mark_offline(*, now: datetime | None = None) -> list[str]:
    """Nodes whose last heartbeat is older than FLEET_HEARTBEAT_TIMEOUT_S go offline, with their GPUs.

    Rows are locked with SKIP LOCKED: a node whose heartbeat is being written right now is not offline. The
    heartbeat time is checked again under the lock for the same reason."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEET_HEARTBEAT_TIMEOUT_S)
    # A node that never heartbeated was put online by hand (or by demo data), not by an agent: leave it be.
    stale = Node.objects.exclude(status=NodeStatus.OFFLINE).filter(last_heartbeat__lt=cutoff)
    names: list[str] = []
    for node_id in list(stale.values_list("id", flat=True)):
        with transaction.atomic():
            qs = Node.objects.select_for_update(skip_locked=True)
            node = qs.filter(pk=node_id).first()
            if node is None or node.status == NodeStatus.OFFLINE:
                continue
            if node.last_heartbeat is None or node.last_heartbeat >= cutoff:
                continue
            age = round((now - node.last_heartbeat).total_seconds(), 1)
            _node_transition(node=node, to=NodeStatus.OFFLINE, actor=None, reason=f"no heartbeat for {age} s")
            names.append(node.name)
    if names:
        logger.warning("nodes offline (no heartbeat for %ss): %s", settings.FLEET_HEARTBEAT_TIMEOUT_S, ", ".join(names))
    return names


# --- Admin ----------------------------------------------------------------------------------------------------


def node_drain(*, actor: AnyUser, node_name: str, draining: bool = True) -> Node:
    """Drain (or undrain) a node: it stays up, but the scheduler places no new work on it. Idempotent."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None:
            raise NotFound(f"No node {node_name!r}.")
        if node.draining != draining:
            node.draining = draining
            node.save(update_fields=["draining"])
            audit_record(actor=actor, action="node.drain" if draining else "node.undrain", target=node)
        if node.status != NodeStatus.OFFLINE:
            _node_transition(node=node, to=_live_status(node), actor=actor, reason="drain" if draining else "undrain")
    return node


def gpu_probe_request(*, actor: AnyUser, gpu_uuid: str) -> Gpu:
    """Ask the GPU's agent to run the health probe on it; the result comes back as `fleet.probe_result`."""
    with transaction.atomic():
        gpu = Gpu.objects.select_related("node").filter(uuid=gpu_uuid, retired_at__isnull=True).first()
        if gpu is None:
            raise NotFound(f"No GPU {gpu_uuid!r}.")
        if gpu.node.status == NodeStatus.OFFLINE:
            raise Conflict(f"Node {gpu.node.name} is offline; its agent cannot run a probe.")
        audit_record(actor=actor, action="gpu.probe_request", target=gpu)
        agent_send(node=gpu.node, task="agent.run_probe", body={"gpu_uuid": gpu.uuid}, expires_s=600)
    return gpu


def gpu_probe_record(
    *, node_id: int, gpu_uuid: str, result: dict[str, Any] | None, error: str = "", now: datetime | None = None
) -> Gpu:
    """Store a probe's outcome on the GPU. A degraded verdict makes a live GPU `degraded`; a later fine verdict
    makes it `ok` again. A probe that could not run (error) changes no status."""
    now = now or timezone.now()
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().filter(uuid=gpu_uuid, node_id=node_id, retired_at__isnull=True).first()
        if gpu is None:
            raise MessageRejected("unknown_gpu", gpu_uuid)
        gpu.probe = result if result is not None else {"error": error[:2000]}
        gpu.probed_at = now
        fields = ["probe", "probed_at"]
        if result is not None and gpu.status in (GpuStatus.OK, GpuStatus.DEGRADED):
            gpu.status = GpuStatus.DEGRADED if result.get("degraded") is True else GpuStatus.OK
            fields.append("status")
        gpu.save(update_fields=fields)
        Node.objects.filter(pk=node_id).update(last_seen=now)
        audit_record(
            actor=None,
            action="gpu.probe_result",
            target=gpu,
            data={"comparison": (result or {}).get("comparison"), "error": error[:200]},
        )
    return gpu


def gpus_mark_lost(*, node_id: int, uuids: list[str]) -> list[str]:
    """GPUs whose agent reports them lost (NVML: GPU_IS_LOST, fallen off the bus) become `lost` until the node
    registers again (a lost GPU needs a reset or a reboot, after which the agent restarts and registers).
    Conditional UPDATE per GPU, so concurrent reports mark and audit each GPU once. Returns the newly lost."""
    marked: list[str] = []
    lost_ids: list[int] = []
    with transaction.atomic():
        for gpu in Gpu.objects.filter(node_id=node_id, uuid__in=uuids, retired_at__isnull=True).exclude(
            status=GpuStatus.LOST
        ):
            if Gpu.objects.filter(pk=gpu.pk).exclude(status=GpuStatus.LOST).update(status=GpuStatus.LOST):
                audit_record(actor=None, action="gpu.lost", target=gpu, data={"from": gpu.status})
                marked.append(gpu.uuid)
                lost_ids.append(gpu.pk)
    if marked:
        logger.warning("GPUs reported lost by their agent: %s", ", ".join(marked))
        transaction.on_commit(lambda: auth.forget(None))
        # Their bookings move to other GPUs (or end) once this commits; robust: a failure is logged, and the
        # lifecycle tick tries again.
        ids = tuple(sorted(lost_ids))
        transaction.on_commit(lambda: gpus_lost(ids), robust=True)
    return marked
