"""Websocket `/ws/teams/{slug}/`: a team's month-to-date cost and GPU-hours as they accrue.

Authorized in `connect()` (apps/core/consumers.py): members of the team and admins (Team.objects.visible_to); a
team the user may not see closes with 4404, as the REST API's 404. Messages come from the team's channel-layer
group (apps.billing.services.broadcast_team_costs, a beat task every few seconds, pushes only on change). Every
message is JSON with `type` and `ts`: `team.usage` (the figures; one on connect) and `team.notification`.
"""

from __future__ import annotations

from typing import Any

from apps.accounts.models import Team
from apps.accounts.types import User
from apps.core.consumers import AuthorizedConsumer, now_iso

_TeamUsage = tuple[int, dict[str, Any]]


class TeamCostConsumer(AuthorizedConsumer[_TeamUsage]):
    """Streams one team's live month-to-date cost to its members and to admins."""

    def authorize(self, user: User) -> _TeamUsage | None:
        from apps.billing.selectors import usage_summary

        slug = str(self.scope["url_route"]["kwargs"]["slug"])
        team = Team.objects.visible_to(user).filter(slug=slug).first()
        if team is None:
            return None
        return team.pk, usage_summary(team=team)

    async def start(self, found: _TeamUsage) -> None:
        from apps.billing.services import team_group

        team_id, usage = found
        await self.join_group(team_group(team_id))
        await self.accept()
        await self._send("team.usage", usage)

    async def disconnect(self, code: int) -> None:
        await self.leave_groups()

    async def team_usage(self, event: dict[str, Any]) -> None:
        await self._send("team.usage", event["data"])

    async def team_notification(self, event: dict[str, Any]) -> None:
        await self._send("team.notification", event["data"])

    async def _send(self, kind: str, data: dict[str, Any]) -> None:
        await self.send_json({**data, "type": kind, "ts": now_iso()})
