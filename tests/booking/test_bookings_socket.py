"""Websocket /ws/bookings/ on the real ASGI server: open Book pages hear of every booking made, changed or ended,
whoever makes it, with the time it touches; whether it is theirs only for their own teams' bookings. The changes
go through the REST API of the same server process, as a teammate's or another team's would."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
import requests

from tests.booking.conftest import book_body, iso, slot

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


async def _watch(url: str, tokens: dict[str, str], act: Any, count: int) -> dict[str, list[dict[str, Any]]]:
    """Open one socket per viewer, wait for each to say it watches, run `act` (blocking) and collect `count`
    messages per viewer after that."""
    import websockets

    out: dict[str, list[dict[str, Any]]] = {}
    sockets = {}
    try:
        for who, token in tokens.items():
            ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=5)
            sockets[who] = ws
            hello = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert hello["type"] == "bookings.watching", hello
        await asyncio.get_running_loop().run_in_executor(None, act)
        for who, ws in sockets.items():
            out[who] = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(count)]
    finally:
        for ws in sockets.values():
            await ws.close()
    return out


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_every_open_page_hears_each_change_and_only_its_own_teams_as_its_own(
    live_portal, fleet, alice, bob, charlie, make_token
):
    url = f"{live_portal.ws_url}/ws/bookings/"
    start, end = slot(days=1, hour=10)
    api = f"{live_portal.url}/api/v1/reservations/"
    auth = {"Authorization": f"Bearer {make_token(bob, ['read', 'reservations:write'])}"}
    tokens = {"alice": make_token(alice, ["read"]), "charlie": make_token(charlie, ["read"])}
    made: dict[str, Any] = {}

    def book() -> None:
        resp = requests.post(api, json=book_body("vision", start=start, end=end), headers=auth, timeout=30)
        assert resp.status_code == 201, resp.text
        made.update(resp.json())

    got = asyncio.run(_watch(url, tokens, book, 1))
    for who, mine in (("alice", True), ("charlie", False)):
        (msg,) = got[who]
        # Nothing names the team, the booker or the reservation: a page reloads what it may see over REST.
        assert set(msg) == {"type", "ts", "start", "end", "kind", "mine"}, msg
        assert msg["type"] == "bookings.changed" and msg["mine"] is mine and msg["kind"] == "reservation"
        assert _at(msg["start"]) == start and _at(msg["end"]) == end

    # An extension touches the time to its new end; shortening it again touches the time it gave back.
    rid = made["id"]
    longer, shorter = end + timedelta(hours=1), end - timedelta(hours=1)

    def extend_then_shorten() -> None:
        for new_end in (longer, shorter):
            resp = requests.patch(f"{api}{rid}/", json={"end": iso(new_end)}, headers=auth, timeout=30)
            assert resp.status_code == 200, resp.text

    got = asyncio.run(_watch(url, tokens, extend_then_shorten, 2))
    for who in ("alice", "charlie"):
        assert [(_at(m["start"]), _at(m["end"])) for m in got[who]] == [(start, longer), (start, longer)]

    # A cancellation, by the booker, reaches another team's page as well.
    def cancel() -> None:
        assert requests.delete(f"{api}{rid}/", headers=auth, timeout=30).status_code == 200

    got = asyncio.run(_watch(url, tokens, cancel, 1))
    assert got["charlie"][0]["mine"] is False and _at(got["charlie"][0]["end"]) == shorter
    assert got["alice"][0]["mine"] is True


def test_a_job_outside_a_reservation_is_told_when_it_takes_gpus_and_when_it_gives_them_back(
    live_portal, fleet, vision, bob, charlie, make_token
):
    """A job placed outside any reservation holds its GPUs on the Book timeline from its start to its limit (plus
    the slack); its start and its end reach open pages as `kind: job`, the end with the time it gave back."""
    from django.utils import timezone

    from apps.jobs import conf as jobs_conf
    from apps.jobs import services as jobs
    from apps.jobs.models import ContainerImage, JobReason, JobState

    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")
    job = jobs.job_submit(
        user=bob, team=vision, image="portal-test/busybox:latest", command=["true"], max_duration_s=3600
    )
    url = f"{live_portal.ws_url}/ws/bookings/"
    tokens = {"bob": make_token(bob, ["read"]), "charlie": make_token(charlie, ["read"])}
    now = timezone.now()
    limit = now + timedelta(seconds=3600 + jobs_conf.ALLOCATION_SLACK_S)
    started: dict[str, Any] = {}

    def start() -> None:
        node = fleet["nodes"]["big"]
        node.token_digest = "d" * 64  # a registered agent, which the launch command goes to
        node.save(update_fields=["token_digest"])
        started["job"] = jobs.job_start(job=job, node=node, gpus=[fleet["gpus"]["big/0"]], now=now)

    got = asyncio.run(_watch(url, tokens, start, 1))
    for who, mine in (("bob", True), ("charlie", False)):
        (msg,) = got[who]
        assert (msg["type"], msg["kind"], msg["mine"]) == ("bookings.changed", "job", mine), msg
        assert (_at(msg["start"]), _at(msg["end"])) == (now, limit)

    ended: dict[str, Any] = {}

    def finish() -> None:
        running = jobs.job_transition(started["job"], JobState.RUNNING)
        done = jobs.job_transition(running, JobState.SUCCEEDED, reason=JobReason.EXIT_CODE, exit_code=0)
        ended["at"] = done.ended_at

    got = asyncio.run(_watch(url, tokens, finish, 1))
    for who in ("bob", "charlie"):
        (msg,) = got[who]
        assert msg["kind"] == "job" and (_at(msg["start"]), _at(msg["end"])) == (ended["at"], limit), msg


def test_a_token_without_the_read_scope_and_no_sign_in_are_refused(live_portal, bob, make_token):
    from tests.test_permission_matrix import ws_outcome

    url = f"{live_portal.ws_url}/ws/bookings/"
    jobs_only = {"Authorization": f"Bearer {make_token(bob, ['jobs:write'])}"}
    assert asyncio.run(ws_outcome(url, jobs_only)) == "refused (close 4403)"
    assert asyncio.run(ws_outcome(url, {})) == "refused (close 4401)"


def test_a_page_open_longer_than_the_layers_group_expiry_still_hears_changes(fleet, bob, make_token, transactional_db):
    """channels-redis drops a group member once it joined longer ago than `group_expiry` (a day by default); a
    socket joins again every quarter of it. Here the expiry is 3 s and the socket waits 7 s before the change."""
    from tests.conftest import start_live_server

    server = start_live_server(CHANNELS_GROUP_EXPIRY_S="3")
    try:
        url = f"{server.ws_url}/ws/bookings/"
        auth = {"Authorization": f"Bearer {make_token(bob, ['read', 'reservations:write'])}"}
        start, end = slot(days=1, hour=12)

        def book_later() -> None:
            import time

            time.sleep(7)
            body = book_body("vision", start=start, end=end)
            resp = requests.post(f"{server.url}/api/v1/reservations/", json=body, headers=auth, timeout=30)
            assert resp.status_code == 201, resp.text

        got = asyncio.run(_watch(url, {"bob": make_token(bob, ["read"])}, book_later, 1))
        assert got["bob"][0]["type"] == "bookings.changed" and got["bob"][0]["mine"] is True
    finally:
        server.stop()
