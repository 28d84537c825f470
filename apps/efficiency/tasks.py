"""Celery tasks of the efficiency app (queue `portal`, sent by beat)."""

from __future__ import annotations

from celery import shared_task

from apps.efficiency import services, waitlist

# Celery ships no type information: its task decorator is untyped, hence the ignore.


@shared_task(name="efficiency.idle_scan", ignore_result=True, time_limit=120, soft_time_limit=100)  # type: ignore[untyped-decorator]
def idle_scan() -> dict[str, list[str]]:
    """Warn, reclaim and release unused allocations (idempotent: every move is a conditional write)."""
    r = services.idle_scan()
    waitlist.waitlist_serve()  # GPUs freed by this scan (and any missed nudge) go to the waitlist first
    return {"warned": r.warned, "reclaimed": r.reclaimed, "unused": r.unused, "cleared": r.cleared}


@shared_task(name="efficiency.waitlist_serve", ignore_result=True, time_limit=120, soft_time_limit=100)  # type: ignore[untyped-decorator]
def waitlist_serve() -> dict[str, list[int]]:
    """Offer freed GPUs to the waitlist (idempotent; entries are taken with SKIP LOCKED)."""
    return waitlist.waitlist_serve()
