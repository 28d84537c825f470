"""Open Book pages follow bookings as they change, whoever changes them.

Every change of a reservation that is a portal event (created, started, changed, moved, ended, released), and every
start and end of a job outside a reservation (it holds its GPUs on the timeline too: apps.jobs.occupancy), also
queues, after commit, one message to the channel layer's `bookings` group (`apps.core.broadcast`: nothing is sent
while no page is open). `/ws/bookings/` (consumers.py) passes it on to each page as `bookings.changed` with the
time the change touches, what changed (`kind`: a reservation or a job) and whether it is one of the viewer's
teams'; the page reloads what it shows through the REST API, which decides what it may see. Which team changed
what is never sent: the timeline shows every GPU to every signed-in user, other teams' slots with their team only,
and a page learns that much again from the API.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from apps.core import broadcast

GROUP: Final = "bookings"

Kind = Literal["reservation", "job"]


def announce_on_commit(*, team_id: int, start: datetime, end: datetime, kind: Kind = "reservation") -> None:
    """After commit, tell open Book pages that the team's reservations (or its jobs' GPUs) changed in [start, end)."""
    data: dict[str, Any] = {"team_id": team_id, "start": start.isoformat(), "end": end.isoformat(), "kind": kind}
    broadcast.send_on_commit(GROUP, {"type": "bookings.changed", "data": data})
