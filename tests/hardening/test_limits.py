"""Limits, over a real server started with the launcher's command line: request body size (413), rate limits per
token and per IP (429 with Retry-After), websocket frame size (the socket closes, the server keeps serving)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import LiveServer
from tests.hardening.conftest import launcher_web_argv, start_web

pytestmark = [pytest.mark.slow]


def _assert_error(resp: requests.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    body = resp.json()
    assert {"code", "detail", "fields"} <= set(body), body
    assert body["code"] == code, body
    return body


@pytest.fixture
def web(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_web()
    yield server
    server.stop()


@pytest.fixture
def bearer(alice: Any, make_token: Any, settings: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_token(alice, ['read', 'jobs:write', 'reservations:write'])}"}


# --- Request body size ----------------------------------------------------------------------------------

BIG = 2 * 1024 * 1024  # twice DATA_UPLOAD_MAX_MEMORY_SIZE


def _big_json() -> bytes:
    return json.dumps({"name": "x" * BIG, "scopes": ["read"]}).encode()


def test_oversized_body_is_413_in_shape(web: LiveServer, bearer: dict[str, str]) -> None:
    resp = requests.post(
        web.url + "/api/v1/tokens/",
        data=_big_json(),
        headers={**bearer, "Content-Type": "application/json"},
        timeout=30,
    )
    _assert_error(resp, 413, "payload_too_large")
    assert requests.get(web.url + "/api/v1/me", headers=bearer, timeout=10).status_code == 200


def test_oversized_chunked_body_is_413_in_shape(web: LiveServer, bearer: dict[str, str]) -> None:
    """No Content-Length to check up front: the limit must still hold while the body streams in."""
    payload = _big_json()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 64 * 1024):
            yield payload[i : i + 64 * 1024]

    resp = requests.post(
        web.url + "/api/v1/tokens/", data=chunks(), headers={**bearer, "Content-Type": "application/json"}, timeout=30
    )
    _assert_error(resp, 413, "payload_too_large")
    assert requests.get(web.url + "/api/v1/me", headers=bearer, timeout=10).status_code == 200


def test_small_chunked_body_is_parsed(web: LiveServer, bearer: dict[str, str]) -> None:
    payload = json.dumps({"name": "chunked", "scopes": ["read"]}).encode()
    resp = requests.post(
        web.url + "/api/v1/tokens/",
        data=iter([payload[:10], payload[10:]]),
        headers={**bearer, "Content-Type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 201, resp.text[:300]
    assert resp.json()["name"] == "chunked"


def test_body_just_under_the_limit_is_parsed(web: LiveServer, bearer: dict[str, str]) -> None:
    body = json.dumps({"name": "n" * 1000, "scopes": ["read"], "pad": "p" * (900 * 1024)}).encode()
    resp = requests.post(
        web.url + "/api/v1/tokens/", data=body, headers={**bearer, "Content-Type": "application/json"}, timeout=30
    )
    _assert_error(resp, 400, "invalid")  # a name over 100 characters: validated, so the body was read


# --- Rate limits ------------------------------------------------------------------------------------------


def test_rate_limits_per_token_and_per_ip(transactional_db: Any, alice: Any, bob: Any, make_token: Any) -> None:
    token_a = {"Authorization": f"Bearer {make_token(alice, ['read'])}"}
    token_b = {"Authorization": f"Bearer {make_token(bob, ['read'])}"}
    server = start_web(env={"API_RATE_PER_TOKEN": "4/min", "API_RATE_PER_IP": "7/min"})
    try:
        me = server.url + "/api/v1/me"
        assert [requests.get(me, headers=token_a, timeout=10).status_code for _ in range(4)] == [200] * 4
        limited = requests.get(me, headers=token_a, timeout=10)
        _assert_error(limited, 429, "throttled")
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        # Another token from the same address has its own allowance, but the address's is shared: DRF asks
        # every throttle, so token A's five requests (the refused one too) counted 5 of the IP's 7.
        statuses = [requests.get(me, headers=token_b, timeout=10).status_code for _ in range(4)]
        assert statuses == [200, 200, 429, 429], statuses
        refused = requests.get(me, headers=token_b, timeout=10)
        _assert_error(refused, 429, "throttled")
        assert int(refused.headers["Retry-After"]) >= 1
        # Health stays reachable for load balancers whatever the limits.
        assert requests.get(server.url + "/api/v1/health", timeout=10).status_code == 200
    finally:
        server.stop()


def test_failed_authentication_counts_against_the_address(transactional_db: Any) -> None:
    server = start_web(env={"API_RATE_PER_IP": "5/min"})
    try:
        me = server.url + "/api/v1/me"
        bad = {"Authorization": "Bearer gpp_nope_guessed0000000000"}
        statuses = [requests.get(me, headers=bad, timeout=10).status_code for _ in range(5)]
        assert statuses == [401] * 5, statuses
        _assert_error(requests.get(me, headers=bad, timeout=10), 429, "throttled")
        refused = requests.get(me, timeout=10)  # anonymous, same address
        _assert_error(refused, 429, "throttled")
        assert int(refused.headers["Retry-After"]) >= 1
    finally:
        server.stop()


# --- Websocket frame size ---------------------------------------------------------------------------------


def test_launcher_caps_websocket_frames() -> None:
    argv = launcher_web_argv(8000)
    assert "--ws-max-size" in argv
    assert int(argv[argv.index("--ws-max-size") + 1]) <= 64 * 1024


async def _ping(url: str, headers: dict[str, str]) -> dict[str, Any]:
    async with websockets.connect(url, additional_headers=headers, open_timeout=5) as ws:
        await ws.send(json.dumps({"type": "ping"}))
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), timeout=5))
            if message.get("type") == "pong":
                return dict(message)


@pytest.fixture
def vision_job_path(alice: Any, bob: Any, charlie: Any, admin: Any, vision: Any, nlp: Any, make_token: Any) -> str:
    from tests.test_permission_matrix import Cast, _obj_job

    cast = Cast(users={"member": alice}, vision=vision, nlp=nlp, make_token=make_token)
    return f"/ws/jobs/{_obj_job(cast)['job_id']}/"


@pytest.mark.parametrize("route", ["fleet", "job"])
def test_oversized_websocket_frame_closes_that_socket_only(
    route: str, web: LiveServer, bearer: dict[str, str], request: pytest.FixtureRequest
) -> None:
    """The job stream ignores what clients send, so there only the server's frame cap (uvicorn --ws-max-size,
    from the launcher) stands between a client and the server buffering its frame."""
    path = "/ws/fleet/" if route == "fleet" else request.getfixturevalue("vision_job_path")
    url = web.ws_url + path

    async def scenario() -> tuple[int | None, dict[str, Any], dict[str, Any]]:
        async with websockets.connect(url, additional_headers=bearer, open_timeout=5) as bystander:
            async with websockets.connect(url, additional_headers=bearer, open_timeout=5, max_size=None) as big:
                await big.send("x" * (256 * 1024))
                try:
                    while True:
                        await asyncio.wait_for(big.recv(), timeout=5)
                except ConnectionClosed as exc:
                    code = exc.rcvd.code if exc.rcvd else None
            await bystander.send(json.dumps({"type": "ping"}))
            while True:
                got = json.loads(await asyncio.wait_for(bystander.recv(), timeout=5))
                if got.get("type") == "pong":
                    break
        return code, got, await _ping(url, bearer)

    code, bystander_pong, fresh_pong = asyncio.run(scenario())
    assert code == 1009  # "message too big"
    assert bystander_pong["type"] == "pong" and fresh_pong["type"] == "pong"


def test_websocket_from_a_foreign_origin_is_refused(web: LiveServer, bearer: dict[str, str]) -> None:
    url = web.ws_url + "/ws/fleet/"

    async def foreign() -> int:
        try:
            async with websockets.connect(url, additional_headers=bearer, origin="https://evil.example"):  # type: ignore[arg-type]
                return 101
        except InvalidStatus as exc:
            return int(exc.response.status_code)

    assert asyncio.run(foreign()) == 403
    # Our own origin (a browser on the portal's page) and no origin at all (CLI with a token) are admitted.
    assert asyncio.run(_ping(url, {**bearer, "Origin": web.url}))["type"] == "pong"
    assert asyncio.run(_ping(url, bearer))["type"] == "pong"
