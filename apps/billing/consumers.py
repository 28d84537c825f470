"""Websocket `/ws/teams/{slug}/`: a team's month-to-date cost and GPU-hours as they accrue.

Authentication happened in the middleware (session cookie or bearer token, apps/accounts/ws_auth.py); `connect()`
authorizes: members of the team and admins (Team.objects.visible_to). Messages come from the team's channel-layer
group (apps.billing.services.broadcast_team_costs, a beat task every few seconds, pushes only on change). Every
message is JSON with `type` and `ts`: `team.usage` (the figures; one on connect) and `team.notification`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.accounts.models import Scope, Team

CLOSE_UNAUTHENTICATED: Final = 4401
CLOSE_FORBIDDEN: Final = 4403
CLOSE_NOT_FOUND: Final = 4404


def _team_and_usage(user: Any, slug: str) -> tuple[int, dict[str, Any]] | None:
    from apps.billing.selectors import usage_summary

    team = Team.objects.visible_to(user).filter(slug=slug).first()
    if team is None:
        return None
    return team.pk, usage_summary(team=team)


class TeamCostConsumer(AsyncJsonWebsocketConsumer):
    """Streams one team's live month-to-date cost to its members and to admins."""

    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            # Accept then close, so the browser sees 4401 (and stops retrying) instead of an opaque 1006.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        token = self.scope.get("token")
        if token is not None and not token.has_scope(Scope.READ):
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        slug = str(self.scope["url_route"]["kwargs"]["slug"])
        found = await database_sync_to_async(_team_and_usage)(user, slug)
        if found is None:
            # Not a member (or no such team): the same answer for both, as the REST API's 404.
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        team_id, usage = found
        from apps.billing.services import team_group

        self.group = team_group(team_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._send("team.usage", usage)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "ts": _now_iso()})

    async def team_usage(self, event: dict[str, Any]) -> None:
        await self._send("team.usage", event["data"])

    async def team_notification(self, event: dict[str, Any]) -> None:
        await self._send("team.notification", event["data"])

    async def _send(self, kind: str, data: dict[str, Any]) -> None:
        await self.send_json({**data, "type": kind, "ts": _now_iso()})


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
