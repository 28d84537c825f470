"""`/ws/jobs/` on the real ASGI server: the Jobs list hears when its viewer's teams' jobs change state (admins: any
job), never another team's; a team joined while the list is open counts from then on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.utils import timezone

from apps.accounts.models import Membership
from apps.jobs import services
from apps.jobs.models import JobReason, JobState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


async def _hear(url: str, tokens: dict[str, str], act: Any, quiet_s: float = 2.0) -> dict[str, list[dict[str, Any]]]:
    """One socket per viewer; after each says it watches, run `act` (blocking) and collect what each hears until
    it has been quiet for `quiet_s`."""
    import websockets

    sockets = {}
    heard: dict[str, list[dict[str, Any]]] = {}
    try:
        for who, token in tokens.items():
            ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=5)
            sockets[who] = ws
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "jobs.watching"
        await asyncio.get_running_loop().run_in_executor(None, act)
        for who, ws in sockets.items():
            heard[who] = []
            try:
                while True:
                    heard[who].append(json.loads(await asyncio.wait_for(ws.recv(), quiet_s)))
            except TimeoutError:
                pass
    finally:
        for ws in sockets.values():
            await ws.close()
    return heard


def test_the_list_hears_its_teams_jobs_change_and_nothing_of_other_teams(
    live_portal, fleet, images, vision, alice, charlie, admin, submit, make_token
):
    url = f"{live_portal.ws_url}/ws/jobs/"
    tokens = {
        who: make_token(user, ["read"]) for who, user in (("alice", alice), ("charlie", charlie), ("admin", admin))
    }
    made: dict[str, Any] = {}

    def submit_start_and_run() -> None:
        job = made["job"] = submit(alice, vision)
        started = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
        services.job_transition(started, JobState.RUNNING)

    heard = asyncio.run(_hear(url, tokens, submit_start_and_run))
    job = made["job"]
    expected = [
        ("jobs.changed", job.pk, "queued"),
        ("jobs.changed", job.pk, "starting"),
        ("jobs.changed", job.pk, "running"),
    ]
    for who in ("alice", "admin"):
        assert [(m["type"], m["job"], m["state"]) for m in heard[who]] == expected, heard[who]
        assert set(heard[who][0]) == {"type", "ts", "job", "state"}  # nothing of the job but its id and state
    assert heard["charlie"] == []

    # Charlie joins the team: his open list hears its jobs from then on.
    def join_then_finish() -> None:
        import time

        Membership.objects.create(user=charlie, team=vision)
        time.sleep(2)  # the socket checks its access again a moment after the change
        job.refresh_from_db()
        services.job_transition(job, JobState.SUCCEEDED, reason=JobReason.EXIT_CODE, exit_code=0)

    heard = asyncio.run(_hear(url, {"charlie": tokens["charlie"]}, join_then_finish))
    assert [(m["job"], m["state"]) for m in heard["charlie"]] == [(job.pk, "succeeded")], heard
