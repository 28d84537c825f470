"""Housekeeping for accounts, run by Celery beat."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.accounts.services import tokens_prune

logger = logging.getLogger(__name__)


@shared_task(  # type: ignore[untyped-decorator]  # Celery ships no types
    name="accounts.prune_tokens", ignore_result=True, time_limit=600, soft_time_limit=540
)
def prune_tokens() -> int:
    deleted = tokens_prune()
    if deleted:
        logger.info("deleted %d tokens revoked or expired over TOKEN_RETENTION_DAYS ago", deleted)
    return deleted
