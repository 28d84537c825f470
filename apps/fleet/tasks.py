"""Celery tasks of the fleet: agent reports (queue `control`) and the liveness check (beat, queue `portal`).

Agent reports are refused, logged and counted when malformed, from an unknown node, with a wrong token or with
out-of-range values (apps.fleet.messages); a refusal never raises out of the task, so a hostile or broken agent
cannot make the consumer retry, crash or write half a row.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import OperationalError

from apps.fleet import services
from apps.fleet.auth import node_authenticate
from apps.fleet.messages import MessageRejected, check_heartbeat, check_probe_result, check_registration
from apps.telemetry.ingest import record_rejection

logger = logging.getLogger(__name__)

# Agents send these by name to queue `control` (workers/transport.py); beat sends the others to the default queue
# `portal`. Routing lives with the senders (Celery deprecates a `queue` attribute on tasks).
_CONTROL = {"ignore_result": True, "time_limit": 30, "soft_time_limit": 20, "acks_late": True}


def _refuse(task: str, payload: Any, exc: MessageRejected) -> None:
    node = payload.get("node") if isinstance(payload, dict) else None
    record_rejection(exc.reason)
    logger.warning("%s from node %r refused: %s", task, str(node)[:100], exc)


# Celery ships no type information: its task decorator is untyped, hence the ignore on each task.
@shared_task(name="fleet.register", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5, **_CONTROL)  # type: ignore[untyped-decorator]
def register(payload: Any) -> None:
    try:
        reg = check_registration(payload)
        ident = node_authenticate(reg.envelope.node, reg.envelope.token)
        services.node_register(
            node_id=ident.id,
            gpus=reg.gpus,
            agent_version=reg.agent_version,
            driver_version=reg.driver_version,
            hostname=reg.hostname,
            backend=reg.backend,
        )
    except MessageRejected as exc:
        _refuse("fleet.register", payload, exc)


@shared_task(name="fleet.heartbeat", **_CONTROL)  # type: ignore[untyped-decorator]
def heartbeat(payload: Any) -> None:
    try:
        hb = check_heartbeat(payload)
        ident = node_authenticate(hb.envelope.node, hb.envelope.token)
        services.node_heartbeat(node_id=ident.id, agent_version=hb.agent_version)
    except MessageRejected as exc:
        _refuse("fleet.heartbeat", payload, exc)


@shared_task(name="fleet.probe_result", autoretry_for=(OperationalError,), max_retries=3, **_CONTROL)  # type: ignore[untyped-decorator]
def probe_result(payload: Any) -> None:
    try:
        report = check_probe_result(payload)
        ident = node_authenticate(report.envelope.node, report.envelope.token)
        services.gpu_probe_record(node_id=ident.id, gpu_uuid=report.gpu_uuid, result=report.result, error=report.error)
    except MessageRejected as exc:
        _refuse("fleet.probe_result", payload, exc)


@shared_task(name="fleet.mark_offline", ignore_result=True, time_limit=60, soft_time_limit=50)  # type: ignore[untyped-decorator]
def mark_offline() -> list[str]:
    return services.nodes_mark_offline()
