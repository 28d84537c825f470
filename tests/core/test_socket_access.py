"""Open websockets keep only the access they still have (apps/core/socket_access.py), on the real ASGI server:
a member taken out of the team, a revoked token, a deactivated account close the socket at once (the web process
hears the change from PostgreSQL); a team joined while watching changes what the socket calls the viewer's own; an
expired token and a signed-out session close it at the next periodic check."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.accounts.models import ApiToken, Membership
from apps.booking import services as booking
from tests.booking.conftest import slot
from tests.factories import GpuFactory, NodeFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


async def _close_code_after(
    url: str, headers: dict[str, str], change: Any, within_s: float = 10.0, hello: bool = True
) -> int | None:
    """Open the socket, read its first message (`hello`), make `change` (blocking) and return the code the server
    closes the socket with (None if it stays open `within_s`)."""
    import websockets
    from websockets.exceptions import ConnectionClosed

    async with websockets.connect(url, additional_headers=headers, open_timeout=5, max_size=None) as ws:
        if hello:
            await asyncio.wait_for(ws.recv(), 5)
        else:
            await asyncio.sleep(1)  # the fleet socket says nothing until a snapshot comes: give it time to join
        await asyncio.get_running_loop().run_in_executor(None, change)
        deadline = time.monotonic() + within_s
        try:
            while time.monotonic() < deadline:
                await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            return None
    return None


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_member_taken_out_of_the_team_stops_hearing_its_costs(live_portal, vision, bob, make_token):
    url = f"{live_portal.ws_url}/ws/teams/vision/"

    def remove() -> None:
        Membership.objects.filter(user=bob, team=vision).delete()

    assert asyncio.run(_close_code_after(url, _bearer(make_token(bob, ["read"])), remove)) == 4404


def test_a_revoked_token_and_a_deactivated_account_end_their_sockets(live_portal, vision, alice, bob, make_token):
    token = make_token(bob, ["read"])

    def revoke() -> None:
        ApiToken.objects.filter(user=bob).update(revoked_at=timezone.now())

    assert asyncio.run(_close_code_after(f"{live_portal.ws_url}/ws/bookings/", _bearer(token), revoke)) == 4401

    def deactivate() -> None:
        alice.is_active = False
        alice.save(update_fields=["is_active"])

    token = make_token(alice, ["read"])
    url = f"{live_portal.ws_url}/ws/fleet/"
    assert asyncio.run(_close_code_after(url, _bearer(token), deactivate, hello=False)) == 4401


def test_a_change_elsewhere_leaves_sockets_that_still_hold_open(live_portal, vision, nlp, bob, charlie, make_token):
    def unrelated() -> None:
        Membership.objects.filter(user=charlie, team=nlp).delete()

    url = f"{live_portal.ws_url}/ws/teams/vision/"
    assert asyncio.run(_close_code_after(url, _bearer(make_token(bob, ["read"])), unrelated, within_s=3)) is None


def test_a_team_joined_while_watching_makes_its_bookings_the_viewers_own(
    live_portal, vision, alice, charlie, make_token
):
    import websockets

    GpuFactory(node=NodeFactory(name="big"), index=0, uuid="GPU-big-0")
    url = f"{live_portal.ws_url}/ws/bookings/"
    start, end = slot(days=1, hour=10)
    headers = _bearer(make_token(charlie, ["read"]))

    async def watch() -> list[bool]:
        mine = []
        async with websockets.connect(url, additional_headers=headers) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "bookings.watching"
            loop = asyncio.get_running_loop()
            for hour in (8, 12):
                s, e = start.replace(hour=hour), end.replace(hour=hour + 2)
                await loop.run_in_executor(
                    None,
                    lambda s=s, e=e: booking.reservation_create(
                        user=alice, team=vision, start=s, end=e, gpus=["GPU-big-0"]
                    ),
                )
                mine.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["mine"])
                if hour == 8:
                    await loop.run_in_executor(None, lambda: Membership.objects.create(user=charlie, team=vision))
                    await asyncio.sleep(2)  # the socket checks again a moment after the change
        return mine

    assert asyncio.run(watch()) == [False, True]


def test_an_expired_token_and_a_signed_out_session_end_at_the_next_check(vision, bob, transactional_db):
    from django.contrib.sessions.models import Session

    from tests.conftest import start_live_server

    server = start_live_server(WS_ACCESS_RECHECK_S="1")
    try:
        from apps.accounts import services as accounts

        token, plaintext = accounts.token_create(user=bob, name="short", scopes=["read"], expires_days=1)

        def expire() -> None:
            ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() + timedelta(seconds=1))

        url = f"{server.ws_url}/ws/teams/vision/"
        assert asyncio.run(_close_code_after(url, _bearer(plaintext), expire)) == 4401

        client = Client()
        client.force_login(bob)
        cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": server.url}

        def sign_out_elsewhere() -> None:
            Session.objects.all().delete()

        assert asyncio.run(_close_code_after(url, cookie, sign_out_elsewhere)) == 4401
    finally:
        server.stop()


def test_signing_out_ends_the_sessions_sockets_at_once(live_portal, vision, bob):
    """The browser's other tabs: signing out in one closes the sockets its session opened, without waiting for
    the periodic check (5 minutes here)."""
    client = Client()
    client.force_login(bob)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": live_portal.url}

    def sign_out() -> None:
        assert client.post("/accounts/logout/").status_code == 302

    url = f"{live_portal.ws_url}/ws/teams/vision/"
    assert asyncio.run(_close_code_after(url, cookie, sign_out, within_s=5)) == 4401
