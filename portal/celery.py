"""The portal's Celery app: tasks of the portal (queue `portal`) and agent reports (queue `control`)."""

from __future__ import annotations

import os

from celery import Celery, signals

from workers.internals.kombu_clients import reuse_redis_clients

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
reuse_redis_clients()

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _fresh_database_state(**kwargs: object) -> None:
    """Before each task, what Django does before each request: close a connection that is past DB_CONN_MAX_AGE or
    broke (a database restart), and re-arm CONN_HEALTH_CHECKS. Celery leaves connections open between tasks only
    because of CELERY_DB_REUSE_MAX (settings); without this a dead connection would fail the next task."""
    from django.db import close_old_connections

    task = kwargs.get("task")
    if getattr(getattr(task, "request", None), "is_eager", False):
        return  # run in the caller's process and transaction (tests, apply()): its connection is not ours
    close_old_connections()


signals.task_prerun.connect(_fresh_database_state)


def _django_logging(**kwargs: object) -> None:
    """Logging as Django's LOGGING says, in the worker and beat too: with a receiver of this signal Celery sets up
    none of its own. Its own setup replaces the root logger's handlers, and with them the filter that masks tokens
    (workers.logredact), so an agent report's token logged by mistake would have reached the worker's log in
    clear. One format for every process; LOG_LEVEL and TASK_LOG_LEVEL (settings) decide what is shown."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


signals.setup_logging.connect(_django_logging)
