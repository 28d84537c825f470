"""Faults with real processes: PostgreSQL stopped and started, Redis killed and restarted, the web process
SIGKILLed in the middle of a booking burst. Everything runs on a PRIVATE PostgreSQL cluster and a PRIVATE
redis-server (tests/support/private_services.py), so the shared servers are never disturbed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from bench.load_test import Connection, HttpError, audit, run_seed
from tests.conftest import REPO, LiveServer, subprocess_env
from tests.hardening.conftest import start_web
from tests.support.private_services import PrivatePostgres, PrivateRedis
from tests.test_permission_matrix import ws_outcome

pytestmark = pytest.mark.slow

PASSWORD = "load-test-password"  # bench.load_test.seed


class Portal:
    def __init__(self, pg: PrivatePostgres, url: str, seeded: dict[str, Any]) -> None:
        self.pg = pg
        self.url = url
        self.seeded = seeded
        member = next(u for u in seeded["users"] if not u["is_staff"])
        self.member = member
        self.bearer = {"Authorization": f"Bearer {member['token']}"}


@pytest.fixture(scope="module")
def portal_db() -> Iterator[Portal]:
    pg = PrivatePostgres()
    pg.start()
    try:
        url = pg.createdb("portal_fault")
        env = subprocess_env(DATABASE_URL=url)
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300
        )
        seeded = run_seed(env, teams=2, users_per_team=2, nodes=4, gpus_per_node=4)
        yield Portal(pg, url, seeded)
    finally:
        pg.destroy()


def _no_traceback(resp: requests.Response) -> None:
    assert "Traceback" not in resp.text and 'File "' not in resp.text, resp.text[:500]


def _assert_unavailable(resp: requests.Response) -> dict[str, Any]:
    assert resp.status_code == 503, (resp.status_code, resp.text[:300])
    _no_traceback(resp)
    body = resp.json()
    assert {"code", "detail", "fields"} <= set(body), body
    assert int(resp.headers["Retry-After"]) >= 1
    return dict(body)


def _login(base: str) -> requests.Session:
    """A browser session (cookie), signed in as the seeded member."""
    session = requests.Session()
    page = session.get(base + "/accounts/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:300]
    resp = session.post(
        base + "/accounts/login/",
        data={"username": "load00u01", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": base + "/accounts/login/"},
        timeout=10,
        allow_redirects=False,
    )
    assert resp.status_code == 302, (resp.status_code, resp.text[:300])
    return session


def _until(predicate: Any, timeout: float) -> float:
    """Poll `predicate()` until true; seconds it took. Fails after `timeout`."""
    began = time.monotonic()
    last: Any = None
    while time.monotonic() - began < timeout:
        try:
            last = predicate()
            if last is True:
                return time.monotonic() - began
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"not recovered after {timeout}s: {last}")


@pytest.fixture
def web(portal_db: Portal) -> Iterator[LiveServer]:
    server = start_web(database_url=portal_db.url)
    yield server
    server.stop()


# --- PostgreSQL outage ------------------------------------------------------------------------------------


def test_database_outage_is_503_in_shape_and_recovers_without_restart(portal_db: Portal, web: LiveServer) -> None:
    me = web.url + "/api/v1/me"
    browser = _login(web.url)
    assert requests.get(me, headers=portal_db.bearer, timeout=10).status_code == 200
    assert browser.get(web.url + "/", timeout=10).status_code == 200

    portal_db.pg.stop("immediate")
    try:
        for path in ("/api/v1/me", "/api/v1/gpus/", "/api/v1/reservations/", "/api/v1/teams/"):
            body = _assert_unavailable(requests.get(web.url + path, headers=portal_db.bearer, timeout=15))
            assert body["code"] == "unavailable"
        health = requests.get(web.url + "/api/v1/health", timeout=15)
        assert health.status_code == 503 and health.json()["database"] == "down", health.text
        page = browser.get(web.url + "/", timeout=15)
        assert page.status_code == 503, page.status_code
        _no_traceback(page)
        assert "text/html" in page.headers["Content-Type"]
        # A websocket needs the database to authenticate: refused promptly, not left hanging.
        began = time.monotonic()
        outcome = asyncio.run(ws_outcome(web.ws_url + "/ws/fleet/", portal_db.bearer))
        assert outcome == "refused (HTTP 503)", outcome
        assert time.monotonic() - began < 10
    finally:
        portal_db.pg.start()

    took = _until(lambda: requests.get(me, headers=portal_db.bearer, timeout=10).status_code == 200, 20)
    assert requests.get(web.url + "/api/v1/health", timeout=10).status_code == 200
    assert browser.get(web.url + "/", timeout=10).status_code == 200
    assert web.proc.poll() is None  # the same web process
    assert asyncio.run(ws_outcome(web.ws_url + "/ws/fleet/", portal_db.bearer)) == "accepted"
    print(f"recovered {took:.2f}s after PostgreSQL came back")


def test_request_stuck_behind_a_lock_fails_after_the_statement_timeout(portal_db: Portal) -> None:
    """Someone holds a lock the API needs (a long migration, a stuck admin session): requests answer 503 in the
    error shape after DB_STATEMENT_TIMEOUT_MS instead of hanging, and carry on once the lock is gone."""
    import psycopg

    server = start_web(database_url=portal_db.url, env={"DB_STATEMENT_TIMEOUT_MS": "500"})
    try:
        me = server.url + "/api/v1/me"
        assert requests.get(me, headers=portal_db.bearer, timeout=10).status_code == 200
        with psycopg.connect(portal_db.url) as holder:
            holder.execute("LOCK TABLE accounts_apitoken IN ACCESS EXCLUSIVE MODE")
            began = time.monotonic()
            stuck = requests.get(me, headers=portal_db.bearer, timeout=30)
            waited = time.monotonic() - began
            holder.rollback()
        _assert_unavailable(stuck)
        assert waited < 5, waited
        assert requests.get(me, headers=portal_db.bearer, timeout=10).status_code == 200
    finally:
        server.stop()


# --- Redis restart ----------------------------------------------------------------------------------------


def _booking(team: str, model: str, day: int) -> dict[str, Any]:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(days=day, hours=2)
    return {
        "team": team,
        "gpu_count": 1,
        "gpu_model": model,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }


def test_redis_restart_keeps_pages_and_api_answering(portal_db: Portal) -> None:
    redis_server = PrivateRedis()
    redis_server.start()
    server = start_web(database_url=portal_db.url, env={"REDIS_URL": redis_server.url()})
    try:
        api, bearer = server.url + "/api/v1", portal_db.bearer
        team, model = portal_db.member["teams"][0], portal_db.seeded["models"][0]
        browser = _login(server.url)
        assert requests.get(api + "/health", timeout=10).json()["broker"] == "ok"

        redis_server.stop()
        began = time.monotonic()
        health = requests.get(api + "/health", timeout=15)
        assert health.status_code == 503, health.text
        assert health.json()["broker"] == "down" and health.json()["database"] == "ok"
        failures = {}
        for path in ("/me", "/teams/", "/gpus/", "/reservations/", "/jobs/", "/nodes/"):
            resp = requests.get(api + path, headers=bearer, timeout=15)
            if resp.status_code != 200:
                failures[path] = (resp.status_code, resp.text[:200])
        booked = requests.post(api + "/reservations/", json=_booking(team, model, 3), headers=bearer, timeout=30)
        if booked.status_code != 201:
            failures["POST /reservations/"] = (booked.status_code, booked.text[:200])
        page = browser.get(server.url + "/", timeout=15)
        if page.status_code != 200:
            failures["page /"] = (page.status_code, page.text[:200])
        outage_s = time.monotonic() - began
        assert not failures, f"while Redis was down: {failures}"
        assert outage_s < 30, f"requests during the outage took {outage_s:.1f}s in all"

        redis_server.start()
        took = _until(lambda: requests.get(api + "/health", timeout=10).status_code == 200, 30)
        assert requests.get(api + "/me", headers=bearer, timeout=10).status_code == 200
        assert server.proc.poll() is None
        print(f"health green {took:.2f}s after Redis came back; outage requests took {outage_s:.1f}s")
    finally:
        server.stop()
        redis_server.destroy()


def test_hung_redis_costs_requests_seconds_not_minutes(portal_db: Portal) -> None:
    """A Redis that stops answering (SIGSTOP: connections open, no replies) instead of refusing connections:
    the rate limiter stops asking it after one timeout, and health says so in about a second."""
    redis_server = PrivateRedis()
    redis_server.start()
    server = start_web(database_url=portal_db.url, env={"REDIS_URL": redis_server.url()})
    assert redis_server.proc is not None
    try:
        api, bearer = server.url + "/api/v1", portal_db.bearer
        assert requests.get(api + "/me", headers=bearer, timeout=10).status_code == 200
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            timings = []
            for _ in range(3):
                began = time.monotonic()
                assert requests.get(api + "/me", headers=bearer, timeout=30).status_code == 200
                timings.append(time.monotonic() - began)
            began = time.monotonic()
            health = requests.get(api + "/health", timeout=30)
            health_s = time.monotonic() - began
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert timings[0] < 4.5, timings  # one cache timeout (2 s), not one per throttle (4 s) or worse
        assert max(timings[1:]) < 1.5, timings
        assert health.status_code == 503 and health.json()["broker"] == "down", health.text
        assert health_s < 3.0, health_s
        _until(lambda: requests.get(api + "/health", timeout=10).status_code == 200, 30)
        print(f"/me while Redis hung: {[round(t, 2) for t in timings]} s; health answered in {health_s:.2f}s")
    finally:
        server.stop()
        redis_server.destroy()


# --- Web process killed mid-burst -------------------------------------------------------------------------


async def _burst(
    url: str, users: list[dict[str, Any]], models: list[str], seconds: float
) -> tuple[list[tuple[int, int]], list[tuple[dict[str, str], dict[str, Any]]]]:
    """Clients booking as fast as they can, each request with its own Idempotency-Key (also its note), until the
    server goes away: (id, gpu_count) of every 201, and (headers, body) of every request left unanswered."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    booked: list[tuple[int, int]] = []
    unanswered: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def one(n: int) -> None:
        import json
        import random

        rng = random.Random(n)
        user = users[n % len(users)]
        conn = Connection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            i += 1
            key = f"kill-{n}-{i}"
            headers = {"Authorization": f"Bearer {user['token']}", "Idempotency-Key": key}
            body = _booking(user["teams"][0], rng.choice(models), rng.randrange(1, 20))
            body["gpu_count"] = rng.choice((1, 2, 3))
            body["note"] = key
            try:
                status, content = await conn.request("POST", "/api/v1/reservations/", body=body, headers=headers)
            except HttpError:
                unanswered.append((headers, body))
                return  # the server is gone
            if status == 201:
                doc = json.loads(content)
                booked.append((int(doc["id"]), body["gpu_count"]))

    await asyncio.gather(*(one(n) for n in range(24)))
    return booked, unanswered


def test_web_killed_mid_booking_burst_leaves_only_whole_bookings(portal_db: Portal) -> None:
    server = start_web(database_url=portal_db.url)
    users = [u for u in portal_db.seeded["users"] if not u["is_staff"]]
    try:

        async def scenario() -> tuple[list[tuple[int, int]], list[tuple[dict[str, str], dict[str, Any]]]]:
            burst = asyncio.ensure_future(_burst(server.url, users, portal_db.seeded["models"], 20))
            await asyncio.sleep(2.5)
            os.kill(server.proc.pid, signal.SIGKILL)
            return await burst

        booked, unanswered = asyncio.run(scenario())
        server.proc.wait(10)
    finally:
        server.stop()
    assert booked, "no booking succeeded before the kill: the burst did not run"
    problems = audit(portal_db.url, booked)
    assert not problems, problems

    # A new web process serves, and bookings go through: no lock or half-written row was left behind.
    again = start_web(database_url=portal_db.url)
    try:
        user = users[0]
        bearer = {"Authorization": f"Bearer {user['token']}"}
        listed = requests.get(again.url + "/api/v1/reservations/", headers=bearer, timeout=10)
        assert listed.status_code == 200
        resp = requests.post(
            again.url + "/api/v1/reservations/",
            json=_booking(user["teams"][0], portal_db.seeded["models"][0], 25),
            headers=bearer,
            timeout=30,
        )
        assert resp.status_code == 201, resp.text[:300]
        # The requests the kill left unanswered, retried with their Idempotency-Key as a client would: each is
        # done now or was done before (replayed), never stuck "in progress", never done twice.
        retried: dict[int, int] = {}
        for headers, body in unanswered:
            again_resp = requests.post(again.url + "/api/v1/reservations/", json=body, headers=headers, timeout=30)
            retried[again_resp.status_code] = retried.get(again_resp.status_code, 0) + 1
            if again_resp.status_code != 201:
                assert again_resp.json()["code"] in {"conflict", "quota_exceeded"}, again_resp.text[:300]
            else:
                booked.append((int(again_resp.json()["id"]), body["gpu_count"]))
    finally:
        again.stop()
    import psycopg

    with psycopg.connect(portal_db.url) as conn:
        twice = conn.execute(
            "SELECT note, count(*) FROM booking_reservation WHERE note LIKE 'kill-%%' GROUP BY note HAVING count(*) > 1"
        ).fetchall()
    assert not twice, f"bookings done twice: {twice[:5]}"
    assert not audit(portal_db.url, booked)
    print(f"{len(booked)} bookings 201; {len(unanswered)} unanswered at the kill, retried: {retried}; audit clean")


def test_the_worker_keeps_its_database_connections_and_survives_a_database_restart(
    portal_db: Portal, tmp_path: Any
) -> None:
    """The Celery worker as the launcher starts it keeps one connection per pool process between tasks (a new
    PostgreSQL backend per agent report was a third of the database's CPU at 30 jobs/s); after PostgreSQL restarts,
    the first report it takes still lands (the per-task health check replaces the dead connection)."""
    import psycopg
    from celery import Celery

    from portal.launcher import services as launcher_services

    node = "load-node-000"
    env = subprocess_env(DATABASE_URL=portal_db.url)
    token = subprocess.run(
        [sys.executable, "manage.py", "create_node_token", node], cwd=REPO, env=env, check=True, capture_output=True,
        text=True, timeout=120,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    worker = next(s for s in launcher_services(0, {"PORTAL_VAR_DIR": str(REPO / "var")}) if s.name == "worker")
    assert worker.env.get("DB_CONN_MAX_AGE") == "600"
    redis = PrivateRedis()
    redis.start()
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(
        [*worker.argv[:-2], "-l", "WARNING"], cwd=REPO, env={**env, **worker.env, "REDIS_URL": redis.url(0)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    sender = Celery(broker=redis.url(0))

    def heartbeat() -> datetime:
        sent = datetime.now(UTC)
        body = {"node": node, "token": token, "ts": time.time(), "agent_version": "test", "holds": 0}
        sender.send_task("fleet.heartbeat", args=[body], queue="control", ignore_result=True)
        return sent

    watcher: list[Any] = []  # one connection of the test's own, so it adds no sessions while counting

    def query(sql: str, params: list[Any]) -> Any:
        if not watcher or watcher[0].closed:
            watcher[:] = [psycopg.connect(portal_db.url, connect_timeout=3, autocommit=True)]
        return watcher[0].execute(sql, params).fetchone()

    def seen(sent: datetime) -> bool:
        row = query("SELECT last_heartbeat FROM fleet_node WHERE name = %s", [node])
        return bool(row and row[0] is not None and row[0] >= sent)

    def sessions() -> int:
        return int(query("SELECT sessions FROM pg_stat_database WHERE datname = current_database()", [])[0])

    try:
        first = heartbeat()
        _until(lambda: seen(first), 60)
        before = sessions()
        for _ in range(20):
            last = heartbeat()
        _until(lambda: seen(last), 60)
        # 20 tasks: at most a connection per pool process (2), not one per task.
        assert sessions() - before <= 2, sessions() - before

        watcher[0].close()
        portal_db.pg.stop("immediate")
        portal_db.pg.start()
        after_restart = heartbeat()
        _until(lambda: seen(after_restart), 30)
        assert proc.poll() is None
    finally:
        for conn in watcher:
            conn.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        redis.destroy()
        log.close()
