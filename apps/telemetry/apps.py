import logging

from django.apps import AppConfig

# Agent chatter arrives every second per node; Celery's per-task INFO lines ("received", "succeeded") for these
# would be most of the worker's log (and a measurable share of its CPU at fleet scale). Failures still log.
QUIET_TASKS = frozenset({"telemetry.ingest", "fleet.heartbeat"})


class _QuietAgentTasks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.levelno == logging.INFO and isinstance(args, dict) and args.get("name") in QUIET_TASKS)


class TelemetryConfig(AppConfig):
    """Live GPU samples (Redis) and their per-minute and per-hour rollups (database)."""

    name = "apps.telemetry"
    label = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        for name in ("celery.app.trace", "celery.worker.strategy"):
            logging.getLogger(name).addFilter(_QuietAgentTasks())
