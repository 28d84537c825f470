"""What booking tells the rest of the portal about a reservation's GPUs: holds to the node agents, ends to the
registered hooks (apps.booking.hooks)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from apps.booking import hooks, selectors
from apps.booking.models import Allocation, Reservation
from apps.booking.services.conflicts import iso
from apps.core.errors import Conflict

logger = logging.getLogger(__name__)


def send_holds(reservation_id: int, *, until: datetime | None = None) -> None:
    """Tell each node agent which of its GPUs the reservation holds, for which team, until when. Call inside the
    transaction that made the change: `agent_send` signs each command now and sends it after commit."""
    from apps.fleet.commands import agent_send

    rows = list(
        Allocation.objects.filter(reservation_id=reservation_id)
        .select_related("gpu__node", "team")
        .order_by("gpu__node__name", "gpu__index")
    )
    by_node: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    for a in rows:
        node, holds = by_node.setdefault(a.gpu.node.name, (a.gpu.node, []))
        holds.append(
            {
                "gpu_uuid": a.gpu.uuid,
                "team": a.team.slug,
                "reservation_id": reservation_id,
                "until": iso(until or a.end),
            }
        )
    for node, holds in by_node.values():
        try:
            agent_send(node=node, task="agent.hold_gpus", body={"holds": holds})
        except Conflict:
            # No node token yet, so no agent could verify it; the booking stands, the agent learns on resend.
            logger.warning("node %s has no token; not told about reservation %s", node.name, reservation_id)


def emit_ended(reservation_id: int, *, early: bool) -> None:
    """Call the reservation-ended hooks (after the commit that ended it)."""
    r = Reservation.objects.filter(pk=reservation_id).values("team_id", "end").first()
    if r is None:
        return
    gpu_ids = tuple(Allocation.objects.filter(reservation_id=reservation_id).values_list("gpu_id", flat=True))
    grace = selectors.booking_policy().end_grace_minutes * 60
    hooks.on_reservation_ended(
        hooks.ReservationEnded(
            reservation_id=reservation_id,
            team_id=r["team_id"],
            gpu_ids=gpu_ids,
            ended_at=r["end"],
            early=early,
            grace_s=grace,
        )
    )
