"""Shared fixtures. The cast, as in healthchecks' tests: alice manages team vision, bob is her teammate,
charlie is in team nlp (an outsider to vision), admin is staff, anonymous is nobody."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from apps.accounts import services as account_services
from apps.accounts.models import Role
from tests.factories import MembershipFactory, TeamFactory, UserFactory

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _clean_redis() -> Iterator[None]:
    """Tests own the Redis database they are given (CI hands them a dedicated db number)."""
    from apps.core.redis import get_redis

    try:
        get_redis().flushdb()
    except Exception:
        pass
    yield


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    from django.core.cache import cache

    from apps.core import ttlcache

    try:
        cache.clear()
    except Exception:
        pass
    ttlcache.clear_all()  # this process's few-seconds caches of models, prices, policy and the fleet's shape
    yield


@pytest.fixture
def vision(db: Any) -> Any:
    return TeamFactory(slug="vision", name="Computer Vision")


@pytest.fixture
def nlp(db: Any) -> Any:
    return TeamFactory(slug="nlp", name="NLP")


@pytest.fixture
def alice(vision: Any) -> Any:
    user = UserFactory(username="alice")
    MembershipFactory(user=user, team=vision, role=Role.MANAGER)
    return user


@pytest.fixture
def bob(vision: Any) -> Any:
    user = UserFactory(username="bob")
    MembershipFactory(user=user, team=vision, role=Role.MEMBER)
    return user


@pytest.fixture
def charlie(nlp: Any) -> Any:
    user = UserFactory(username="charlie")
    MembershipFactory(user=user, team=nlp, role=Role.MEMBER)
    return user


@pytest.fixture
def admin(db: Any) -> Any:
    return UserFactory(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def make_token(db: Any) -> Callable[..., str]:
    def make(user: Any, scopes: list[str] | None = None, expires_days: int | None = 30) -> str:
        _, plaintext = account_services.token_create(
            user=user, name="test", scopes=scopes or ["read"], expires_days=expires_days
        )
        return plaintext

    return make


@pytest.fixture
def api_as(make_token: Callable[..., str]) -> Callable[..., APIClient]:
    """`api_as(user, scopes=[...])` → an APIClient sending `Authorization: Bearer`; `api_as(None)` anonymous."""

    def make(user: Any | None, scopes: list[str] | None = None) -> APIClient:
        client = APIClient()
        if user is not None:
            all_scopes = ["read", "jobs:write", "reservations:write"] + (["admin"] if user.is_staff else [])
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(user, scopes or all_scopes)}")
        return client

    return make


# --- Real processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process (web server, Celery worker, agent) that must see the *test* database."""
    db = connection.settings_dict
    env = dict(os.environ)
    user = quote(db.get("USER") or "", safe="")
    auth = f"{user}:{quote(db['PASSWORD'], safe='')}@" if db.get("PASSWORD") else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    # A unix socket folder (the embedded server) is the URL's host, percent-encoded; a TCP host takes a port.
    where = quote(host, safe="") if host.startswith("/") else f"{host}:{db.get('PORT') or 5432}"
    env["DATABASE_URL"] = f"postgres://{auth}{where}/{db['NAME']}"
    env["REDIS_URL"] = settings.REDIS_URL
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout}s: {last}")


class LiveServer:
    """The real ASGI app under uvicorn in a child process, on the test database."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_live_server(**env: str) -> LiveServer:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "portal.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ws-per-message-deflate",
            "false",
            "--no-access-log",
            "--lifespan",
            "off",
            # As portal.serve: a consumer left blocked in the channel layer at shutdown must not hold the stop.
            "--timeout-graceful-shutdown",
            "2",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=subprocess_env(**env),
    )
    server = LiveServer(proc, port)
    try:
        wait_http(server.url + "/api/v1/health", proc=proc)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture
def live_portal(transactional_db: Any) -> Iterator[LiveServer]:
    """uvicorn serving the portal on the test database (use with data committed by the test)."""
    server = start_live_server()
    yield server
    server.stop()
