"""A burst of concurrent API clients must not exhaust PostgreSQL's connections: the web process bounds the
requests it works on at once (apps/core/concurrency.py), the rest wait their turn instead of failing with 503.
On a private PostgreSQL cluster with a small max_connections, so the shared server is never at risk."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from bench.load_test import Connection, HttpError, run_seed
from portal.launcher import web_pool_size
from tests.conftest import REPO, subprocess_env
from tests.hardening.conftest import start_web
from tests.support.private_services import PrivatePostgres

pytestmark = pytest.mark.slow

CLIENTS = 120
SECONDS = 6.0
LIMIT = 12  # WEB_MAX_CONCURRENT_REQUESTS for this test's web process


async def _hammer(url: str, token: str) -> tuple[dict[int, int], int]:
    parts = urlsplit(url)
    statuses: dict[int, int] = {}
    errors = 0

    async def one(n: int) -> None:
        nonlocal errors
        conn = Connection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
        paths = ["/api/v1/me", "/api/v1/gpus/", "/api/v1/reservations/", "/api/v1/teams/"]
        deadline = time.monotonic() + SECONDS
        i = n
        while time.monotonic() < deadline:
            try:
                status, _ = await conn.request(
                    "GET", paths[i % len(paths)], headers={"Authorization": f"Bearer {token}"}
                )
            except HttpError:
                errors += 1
                continue
            statuses[status] = statuses.get(status, 0) + 1
            i += 1
        await conn.close()

    await asyncio.gather(*(one(n) for n in range(CLIENTS)))
    return statuses, errors


def test_concurrent_burst_neither_fails_nor_exhausts_database_connections() -> None:
    with PrivatePostgres(max_connections=40) as pg:
        url = pg.createdb("portal_conn")
        env = subprocess_env(DATABASE_URL=url)
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300
        )
        seeded = run_seed(env, teams=1, users_per_team=2, nodes=1, gpus_per_node=2, staff=0)
        token = seeded["users"][1]["token"]
        server = start_web(
            database_url=url,
            env={"WEB_MAX_CONCURRENT_REQUESTS": str(LIMIT), "API_RATE_PER_TOKEN": "1000000/min",
                 "API_RATE_PER_IP": "1000000/min"},
        )  # fmt: skip
        peak = 0
        backends: set[int] = set()
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            with psycopg.connect(url, autocommit=True) as conn:
                while not stop.is_set():
                    pids = [
                        int(row[0])
                        for row in conn.execute(
                            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                            ("portal_conn",),
                        )
                    ]
                    peak = max(peak, len(pids))
                    backends.update(pids)
                    time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            statuses, errors = asyncio.run(_hammer(server.url, token))
        finally:
            stop.set()
            watcher.join(5)
            server.stop()
    total = sum(statuses.values())
    pool = web_pool_size({"WEB_MAX_CONCURRENT_REQUESTS": str(LIMIT)})
    print(
        f"{total} requests in {SECONDS:.0f}s from {CLIENTS} clients: {statuses}; peak connections {peak}, "
        f"{len(backends)} distinct backends seen (pool of {pool})"
    )
    assert errors == 0, f"{errors} transport errors"
    assert set(statuses) == {200}, statuses
    assert peak <= pool, f"{peak} database connections for at most {LIMIT} requests at once (pool {pool})"
    # The pool reuses its connections: without it every request would be a new backend (hundreds here).
    assert len(backends) <= pool, f"{len(backends)} backends for {total} requests: connections are not reused"


def test_requests_beyond_the_limit_wait_rather_than_fail(settings: Any) -> None:
    """The gate in-process: a request that cannot get a slot in time is 503 in the error shape."""
    from apps.core.concurrency import ConcurrencyGate

    release = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def scenario() -> list[int]:
        gate = ConcurrencyGate(slow_app, limit=1, wait_s=0.2)
        scope = {"type": "http", "path": "/api/v1/me", "method": "GET", "headers": []}

        async def call() -> int:
            out: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                out.append(message)

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            await gate(scope, receive, send)
            sent.extend(out)
            return int(out[0]["status"])

        first = asyncio.ensure_future(call())
        await asyncio.sleep(0.05)
        second = await call()  # waits 0.2 s for the slot the first holds, then gives up
        release.set()
        return [await first, second]

    assert asyncio.run(scenario()) == [200, 503]
    refusal = next(m for m in sent if m["type"] == "http.response.start" and m["status"] == 503)
    assert (b"retry-after", b"1") in refusal["headers"]
