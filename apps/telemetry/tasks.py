"""Celery tasks of telemetry: ingest (queue `control`, the hot path) and rollups (beat, queue `portal`)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from apps.fleet.messages import MessageRejected
from apps.telemetry import jobmem, rollups
from apps.telemetry.ingest import record_rejection, telemetry_ingest

logger = logging.getLogger(__name__)


# No retries and no acks_late: a sample is worth a second; a lost one is replaced by the next. The agent sends it
# with `expires`, so a backlog after an outage is discarded by the worker instead of replayed.
# Celery ships no type information: its task decorator is untyped, hence the ignore on each task.
@shared_task(name="telemetry.ingest", ignore_result=True, acks_late=False, time_limit=10)  # type: ignore[untyped-decorator]
def ingest(payload: Any) -> None:
    try:
        telemetry_ingest(payload)
    except MessageRejected as exc:
        record_rejection(exc.reason)
        node = payload.get("node") if isinstance(payload, dict) else None
        logger.warning("telemetry from node %r refused: %s", str(node)[:100], exc)


@shared_task(name="telemetry.flush_rollups", ignore_result=True, time_limit=120, soft_time_limit=100)  # type: ignore[untyped-decorator]
def flush_rollups() -> int:
    written = rollups.flush_rollups()
    jobmem.flush_job_memory()  # each job's own peak, on the same minute's beat
    return written


@shared_task(name="telemetry.rollup_hours", ignore_result=True, time_limit=300, soft_time_limit=240)  # type: ignore[untyped-decorator]
def rollup_hours() -> int:
    return rollups.rollup_hours()
