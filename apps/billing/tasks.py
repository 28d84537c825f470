"""Celery tasks for billing: thin, idempotent, calling services (beat schedules them; see apps.py)."""

from __future__ import annotations

from celery import shared_task

from apps.billing import services


# Celery ships no type information: its task decorator is untyped, hence the ignore on each task.
@shared_task(name="billing.close_ledger", queue="portal", time_limit=240, soft_time_limit=200, ignore_result=True)  # type: ignore[untyped-decorator]
def close_ledger() -> int:
    """Write the ledger rows of every piece that is over and keep list prices in sync (every minute)."""
    written = services.ledger_close()
    services.list_prices_sync()
    return written


@shared_task(name="billing.broadcast_team_costs", queue="portal", time_limit=30, soft_time_limit=25, ignore_result=True)  # type: ignore[untyped-decorator]
def broadcast_team_costs() -> list[int]:
    """Push changed month-to-date figures to team sockets and fire budget alerts (every few seconds)."""
    return services.broadcast_team_costs()


@shared_task(name="billing.close_months", queue="portal", time_limit=600, soft_time_limit=540, ignore_result=True)  # type: ignore[untyped-decorator]
def close_months() -> list[str]:
    """Freeze every month that is over and not closed yet (hourly; the first run on the 1st does it)."""
    return [f"{m:%Y-%m}" for m in services.close_due_months()]
