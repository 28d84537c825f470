"""Celery tasks for booking: thin, idempotent, calling services."""

from __future__ import annotations

from celery import shared_task

from apps.booking import services


# Celery ships no type information: its task decorator is untyped.
@shared_task(name="booking.lifecycle_tick", time_limit=120, soft_time_limit=100, ignore_result=True)  # type: ignore[untyped-decorator]
def lifecycle_tick() -> dict[str, list[int]]:
    """Activate due reservations and release ended ones, and move or end those a layout change or a gone GPU
    stranded (beat runs it every 15 s; repeats are harmless)."""
    moves = services.reservations_tick()
    stranded = services.reservations_rehome_stranded()
    return {**moves, "rehomed": stranded["moved"], "ended_by_layout": stranded["ended"]}
