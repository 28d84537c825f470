"""Websockets `/ws/jobs/{id}/`: a job's state changes and log lines as they are stored; `/ws/jobs/`: that jobs of
the viewer's teams (admins: any job) changed state, for the Jobs list.

Authorized in `connect()` against `Job.objects.visible_to(user)` (apps/core/consumers.py: someone else's job closes
with 4404, as absent as a missing one). The socket joins the channel-layer group `job.<id>`; services broadcast to
it after commit. Every message is JSON with `type` and `ts`: `state` (sent on connect, then on every change) and
`logs` (`lines`: [{seq, stream, line, at}]). A client that reconnects fetches lines after its last seq over REST.

The list socket joins one group per team of the viewer (`jobs.team.<id>`; admins `jobs.all`) and sends
`jobs.watching` on connect (a client that reconnects reloads, it may have missed changes), then `jobs.changed` with
`job` and `state`; the page reloads its rows over HTTP, which scopes and filters them. When the viewer's teams
change while it is open (apps/core/socket_access.py), it follows them.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from apps.accounts.scoping import team_ids_of
from apps.accounts.types import User
from apps.core.consumers import AuthorizedConsumer, now_iso
from apps.jobs.events import LIST_GROUP_ALL, group_name, list_group, state_message
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


class JobListConsumer(AuthorizedConsumer[frozenset[str]]):
    """Tells a viewer's Jobs list when any job it may list changes state."""

    def authorize(self, user: User) -> frozenset[str]:
        if user.is_staff:
            return frozenset({LIST_GROUP_ALL})
        return frozenset(list_group(t) for t in team_ids_of(user))

    async def start(self, found: frozenset[str]) -> None:
        # Joined before the first message, so a page that reloads on it misses no change made after.
        for group in sorted(found):
            await self.join_group(group)
        await self.accept()
        await self.send_json({"type": "jobs.watching", "ts": now_iso()})

    async def reauthorized(self, found: frozenset[str]) -> None:
        """Joined or left a team (or became an admin, or stopped being one) while the list was open."""
        if found == frozenset(self._groups):
            return
        await self.leave_groups()
        for group in sorted(found):
            await self.join_group(group)

    async def disconnect(self, code: int) -> None:
        await self.leave_groups()

    async def jobs_changed(self, event: dict[str, Any]) -> None:
        data = event["data"]
        await self.send_json({"type": "jobs.changed", "ts": now_iso(), "job": data["job"], "state": data["state"]})
