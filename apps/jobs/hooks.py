"""What the jobs app does when booking says a reservation ended: stop the team's jobs on its GPUs after grace."""

from __future__ import annotations

import logging

from apps.booking.hooks import ReservationEnded

logger = logging.getLogger(__name__)


def stop_jobs_after_grace(event: ReservationEnded) -> None:
    """Booking calls this after commit; the stop runs `event.grace_s` later as a task (nothing sleeps here)."""
    from apps.jobs.tasks import stop_for_reservation

    stop_for_reservation.apply_async(
        args=(event.reservation_id, event.team_id, list(event.gpu_ids)), countdown=max(0, event.grace_s)
    )
    try:
        from apps.core.redis import get_redis
        from apps.jobs.events import WAKE_KEY

        get_redis().lpush(WAKE_KEY, "reservation_ended")
    except Exception as exc:
        logger.warning("could not wake the scheduler: %s", exc)
