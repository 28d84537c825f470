"""Housekeeping for the core app, run by Celery beat."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.core.idempotency import idempotency_records_purge

logger = logging.getLogger(__name__)


@shared_task(  # type: ignore[untyped-decorator]  # Celery ships no types
    name="core.purge_idempotency_records", ignore_result=True, time_limit=600, soft_time_limit=540
)
def purge_idempotency_records() -> int:
    deleted = idempotency_records_purge()
    if deleted:
        logger.info("purged %d expired idempotency records", deleted)
    return deleted
