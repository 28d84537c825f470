"""Moved to workers.internals.celery_wire; re-exported for callers not yet changed."""

from workers.internals.celery_wire import publish, task_message

__all__ = ["publish", "task_message"]
