"""Celery tasks of the jobs app: agent reports (agents send them to queue `control`) and the portal's own (the
default queue `portal`). Queues are chosen by the sender, not declared here (Celery deprecates task queues).

Tasks take plain JSON, authenticate the node, and call services; a refused message is logged and dropped (a
retry would be refused again). Every report is idempotent, so at-least-once delivery is fine.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import transaction

from apps.fleet.auth import node_authenticate
from apps.fleet.messages import MessageRejected
from apps.fleet.models import Node
from apps.jobs import messages, services

logger = logging.getLogger(__name__)

# Celery ships no type information: its task decorator is untyped, hence the ignores on each task.


def _stop_on_node(node_id: int, job_id: int) -> None:
    from apps.fleet.commands import agent_send
    from apps.jobs import conf

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return
    with transaction.atomic():
        agent_send(node=node, task="agent.cancel_job", body={"job_id": job_id, "grace_s": float(conf.CANCEL_GRACE_S)})


@shared_task(name="jobs.report_started", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=True)  # type: ignore[untyped-decorator]
def report_started(payload: dict[str, Any]) -> bool:
    try:
        msg = messages.check_started(payload)
        node = node_authenticate(msg.envelope.node, msg.envelope.token)
    except MessageRejected as exc:
        logger.warning("jobs.report_started refused: %s", exc)
        return False
    verdict = services.job_report_started(node_id=node.id, job_id=msg.job_id, handle=msg.handle, at=msg.at)
    if verdict == "stop":
        # The portal ended the job meanwhile (cancelled while starting, lost): nothing may run for it.
        _stop_on_node(node.id, msg.job_id)
    return verdict == "running"


@shared_task(name="jobs.report_logs", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=True)  # type: ignore[untyped-decorator]
def report_logs(payload: dict[str, Any]) -> int:
    try:
        msg = messages.check_logs(payload)
        node = node_authenticate(msg.envelope.node, msg.envelope.token)
    except MessageRejected as exc:
        logger.warning("jobs.report_logs refused: %s", exc)
        return 0
    stored = 0
    for batch in msg.batches:
        lines = [services.LogLineIn(stream=line.stream, text=line.text, at=line.at) for line in batch.lines]
        stored += services.job_logs_append(
            node_id=node.id, job_id=batch.job_id, epoch=batch.epoch, first=batch.first, lines=lines
        )
    return stored


@shared_task(name="jobs.report_exit", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=True)  # type: ignore[untyped-decorator]
def report_exit(payload: dict[str, Any]) -> bool:
    try:
        msg = messages.check_exit(payload)
        node = node_authenticate(msg.envelope.node, msg.envelope.token)
    except MessageRejected as exc:
        logger.warning("jobs.report_exit refused: %s", exc)
        return False
    return services.job_report_exit(
        node_id=node.id,
        job_id=msg.job_id,
        state=msg.state,
        reason=msg.reason,
        exit_code=msg.exit_code,
        message=msg.message,
        finished_at=msg.finished_at,
        log_total=msg.log_total,
        started_at=msg.started_at,
        handle=msg.handle,
    )


@shared_task(name="jobs.report_inventory", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=True)  # type: ignore[untyped-decorator]
def report_inventory(payload: dict[str, Any]) -> dict[str, list[int]]:
    try:
        msg = messages.check_inventory(payload)
        ident = node_authenticate(msg.envelope.node, msg.envelope.token)
    except MessageRejected as exc:
        logger.warning("jobs.report_inventory refused: %s", exc)
        return {}
    node = Node.objects.get(pk=ident.id)
    items = [services.InventoryItem(job_id=job_id, status=status) for job_id, status in msg.jobs]
    return services.node_reconcile(node=node, items=items, complete=msg.complete)


@shared_task(name="jobs.sweep", ignore_result=True, time_limit=60, soft_time_limit=50)  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    return services.jobs_sweep()


@shared_task(name="jobs.stop_for_reservation", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=True)  # type: ignore[untyped-decorator]
def stop_for_reservation(reservation_id: int, team_id: int, gpu_ids: list[int]) -> list[int]:
    return services.jobs_stop_for_reservation(reservation_id=reservation_id, team_id=team_id, gpu_ids=gpu_ids)
