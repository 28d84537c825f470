"""Websocket `/ws/jobs/{id}/`: a job's state changes and log lines as they are stored.

Authorized in `connect()` against `Job.objects.visible_to(user)` (apps/core/consumers.py: someone else's job closes
with 4404, as absent as a missing one). The socket joins the channel-layer group `job.<id>`; services broadcast to
it after commit. Every message is JSON with `type` and `ts`: `state` (sent on connect, then on every change) and
`logs` (`lines`: [{seq, stream, line, at}]). A client that reconnects fetches lines after its last seq over REST.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from apps.accounts.types import User
from apps.core.consumers import AuthorizedConsumer
from apps.jobs.events import group_name, state_message
from apps.jobs.models import Job


def _visible_job(user: User, job_id: int) -> Job | None:
    return Job.objects.visible_to(user).select_related("node").filter(pk=job_id).first()


class JobConsumer(AuthorizedConsumer[Job]):
    """Streams one job's state and logs to a viewer who may see the job."""

    @property
    def job_id(self) -> int:
        return int(self.scope["url_route"]["kwargs"]["job_id"])

    def authorize(self, user: User) -> Job | None:
        return _visible_job(user, self.job_id)

    async def start(self, found: Job) -> None:
        # Join before reading the state we send, so no change can fall between the two.
        await self.join_group(group_name(self.job_id))
        await self.accept()
        job = await database_sync_to_async(_visible_job)(self.scope["user"], self.job_id)
        if job is not None:
            await self.send_json({**state_message(job), "log_seq": job.log_seq})

    async def disconnect(self, code: int) -> None:
        await self.leave_groups()

    async def job_message(self, event: dict[str, Any]) -> None:
        await self.send_json(event["message"])
