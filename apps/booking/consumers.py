"""Websocket `/ws/bookings/`: that bookings changed, as they change, for the Book and reservation pages (live.py).

Every signed-in user with the read scope may watch, as every signed-in user may read the timeline
(apps/core/consumers.py refuses the others). The socket joins the channel-layer group `bookings` and then sends
`bookings.watching` (on connect and on every reconnect: a page reloads then, since it may have missed changes).
Each change comes as `bookings.changed` with `start` and `end` (the time it touches), `kind` (`reservation`, or
`job` for a job outside a reservation starting or ending) and `mine` (whether it is one of the viewer's teams').
Every message is JSON with `type` and `ts`.
"""

from __future__ import annotations

from typing import Any

from apps.accounts.scoping import team_ids_of
from apps.accounts.types import User
from apps.booking.live import GROUP
from apps.core.consumers import AuthorizedConsumer, now_iso


class BookingsConsumer(AuthorizedConsumer[frozenset[int]]):
    """Tells one viewer's Book page when bookings change; which team's, only for the viewer's own teams."""

    teams: frozenset[int] = frozenset()

    def authorize(self, user: User) -> frozenset[int]:
        return frozenset(team_ids_of(user))

    async def start(self, found: frozenset[int]) -> None:
        self.teams = found
        # Joined before the first message, so a page that reloads on it misses no change made after.
        await self.join_group(GROUP)
        await self.accept()
        await self.send_json({"type": "bookings.watching", "ts": now_iso()})

    async def reauthorized(self, found: frozenset[int]) -> None:
        self.teams = found  # joined or left a team while the page was open: `mine` follows

    async def disconnect(self, code: int) -> None:
        await self.leave_groups()

    async def bookings_changed(self, event: dict[str, Any]) -> None:
        data = event["data"]
        await self.send_json(
            {
                "type": "bookings.changed",
                "ts": now_iso(),
                "start": data["start"],
                "end": data["end"],
                "kind": data.get("kind", "reservation"),
                "mine": data["team_id"] in self.teams,
            }
        )
