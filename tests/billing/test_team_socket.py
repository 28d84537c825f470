"""Websocket /ws/teams/{slug}/ on the real ASGI server: members and admins get the live month-to-date figures
(one message on connect, then one per change pushed by the broadcast task); everyone else is refused."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.billing import services
from tests.billing import helpers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


async def _session(url: str, headers: dict[str, str], then: Any = None, count: int = 1) -> list[Any]:
    import websockets
    from websockets.exceptions import ConnectionClosed

    out: list[Any] = []
    async with websockets.connect(url, additional_headers=headers, open_timeout=5) as ws:
        try:
            out.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
            if then is not None:
                await asyncio.get_running_loop().run_in_executor(None, then)
            while len(out) < count:
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        except ConnectionClosed as exc:
            out.append(("closed", exc.rcvd.code if exc.rcvd else None))
    return out


def test_members_see_the_cost_accrue_and_outsiders_are_refused(live_portal, vision, bob, charlie, make_token):
    now = timezone.now()
    helpers.reserve(vision, bob, helpers.gpus(2), now - timedelta(hours=1), now + timedelta(hours=2))
    url = f"{live_portal.ws_url}/ws/teams/vision/"
    bearer = {"Authorization": f"Bearer {make_token(bob, ['read'])}"}

    first, pushed = asyncio.run(_session(url, bearer, then=lambda: services.broadcast_team_costs(), count=2))
    assert first["type"] == "team.usage" and first["team"] == "vision" and "ts" in first
    assert first["running_gpus"] == 2 and float(first["cost"]) >= 4.99  # 2 GPUs x 1 h x 2.50
    assert pushed["type"] == "team.usage" and float(pushed["cost"]) >= float(first["cost"])

    outsider = {"Authorization": f"Bearer {make_token(charlie, ['read'])}"}
    assert asyncio.run(_session(url, outsider)) == [("closed", 4404)]
    assert asyncio.run(_session(url, {})) == [("closed", 4401)]
    assert asyncio.run(_session(f"{live_portal.ws_url}/ws/teams/nope/", bearer)) == [("closed", 4404)]
