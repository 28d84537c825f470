"""Websocket `/ws/jobs/{id}/`: a job's state changes and log lines as they are stored.

Authorized in `connect()` against `Job.objects.visible_to(user)` (someone else's job closes with 4404, as absent
as a missing one). The socket joins the channel-layer group `job.<id>`; services broadcast to it after commit.
Every message is JSON with `type` and `ts`: `state` (sent on connect, then on every change) and `logs`
(`lines`: [{seq, stream, line, at}]). A client that reconnects fetches lines after its last seq over REST.
"""

from __future__ import annotations

import json
from typing import Any, Final

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from apps.accounts.models import Scope
from apps.jobs.events import group_name, state_message
from apps.jobs.models import Job

CLOSE_UNAUTHENTICATED: Final = 4401
CLOSE_FORBIDDEN: Final = 4403
CLOSE_NOT_FOUND: Final = 4404


def _visible_job(user: Any, job_id: int) -> Job | None:
    return Job.objects.visible_to(user).select_related("node").filter(pk=job_id).first()


class JobConsumer(AsyncWebsocketConsumer):
    """Streams one job's state and logs to a viewer who may see the job."""

    job_id: int = 0
    joined: bool = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        token = self.scope.get("token")
        if token is not None and not token.has_scope(Scope.READ):
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        job = await database_sync_to_async(_visible_job)(user, self.job_id)
        if job is None:
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        # Join before reading the state we send, so no change can fall between the two.
        await self.channel_layer.group_add(group_name(self.job_id), self.channel_name)
        self.joined = True
        await self.accept()
        job = await database_sync_to_async(_visible_job)(user, self.job_id)
        if job is not None:
            await self.send(text_data=json.dumps({**state_message(job), "log_seq": job.log_seq}))

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(group_name(self.job_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # Nothing to say on this stream but pings.
        if text_data and len(text_data) < 200 and '"ping"' in text_data:
            from django.utils import timezone

            await self.send(text_data=json.dumps({"type": "pong", "ts": timezone.now().isoformat()}))

    async def job_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(event["message"]))
