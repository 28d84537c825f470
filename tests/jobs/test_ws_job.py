"""`/ws/jobs/{id}/` against a real uvicorn child process and the Redis channel layer: the state on connect, state
changes and log lines as services commit them; outsiders and anonymous visitors are refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from apps.jobs import services
from apps.jobs.models import JobState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


async def _messages(live: Any, job_id: int, token: str | None, action: Any = None, want: int = 1) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{live.ws_url}/ws/jobs/{job_id}/"
    out: list[dict[str, Any]] = []
    try:
        async with connect(url, origin=live.url, additional_headers=headers, open_timeout=10) as ws:
            out.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            if action is not None:
                await asyncio.get_running_loop().run_in_executor(None, action)
            while len(out) < want:
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None
    return out


def test_state_on_connect_then_changes_and_logs_as_they_commit(alice, vision, submit, fleet, make_token, live_portal):
    job = submit(alice, vision)
    job = services.job_start(job=job, node=fleet["node01"], gpus=fleet["gpus01"][:1], now=timezone.now())
    token = make_token(alice, ["read"])

    def act() -> None:
        try:
            services.job_transition(job, JobState.RUNNING)
            now = timezone.now()
            lines = [services.LogLineIn("stdout", "hello", now), services.LogLineIn("stderr", "oops", now)]
            services.job_logs_append(node_id=fleet["node01"].pk, job_id=job.pk, epoch="e1", first=1, lines=lines)
        finally:
            connection.close()  # this ran on an executor thread with a connection of its own

    messages = async_to_sync(_messages)(live_portal, job.pk, token, act, want=3)

    first, state, logs = messages
    assert first["type"] == "state" and first["state"] == "starting" and "ts" in first
    assert state["type"] == "state" and state["state"] == "running" and state["node"] == "node01"
    assert logs["type"] == "logs" and "ts" in logs
    assert [(line["seq"], line["stream"], line["line"]) for line in logs["lines"]] == [
        (1, "stdout", "hello"),
        (2, "stderr", "oops"),
    ]


def test_outsiders_and_anonymous_are_refused(alice, charlie, vision, submit, make_token, live_portal):
    job = submit(alice, vision)
    assert async_to_sync(_messages)(live_portal, job.pk, make_token(charlie, ["read"])) == 4404
    assert async_to_sync(_messages)(live_portal, job.pk, None) == 4401
    assert async_to_sync(_messages)(live_portal, 999999, make_token(alice, ["read"])) == 4404
