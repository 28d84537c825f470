"""Helpers for the hardening tests: the web server started with the launcher's own command line."""

from __future__ import annotations

import subprocess
from typing import Any

from django.conf import settings

from tests.conftest import REPO, LiveServer, free_port, subprocess_env, wait_http


def launcher_web(port: int, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The `web` child exactly as `make run` (portal/launcher.py) starts it, so the limits tested are shipped:
    its argv and the environment it adds (the database connection pool)."""
    from portal.launcher import services

    base = {**(env or {}), "PORTAL_VAR_DIR": str(settings.VAR_DIR), "HOST": "127.0.0.1"}
    web = next(s for s in services(port, base) if s.name == "web")
    return [*web.argv, "--log-level", "warning"], web.env


def launcher_web_argv(port: int) -> list[str]:
    return launcher_web(port)[0]


def start_web(*, env: dict[str, str] | None = None, database_url: str | None = None, timeout: float = 30) -> LiveServer:
    """uvicorn with the launcher's arguments on the test database (or `database_url`), `env` on top."""
    port = free_port()
    child_env = subprocess_env(**(env or {}))
    if database_url is not None:
        child_env["DATABASE_URL"] = database_url
    argv, web_env = launcher_web(port, env)
    child_env = {**child_env, **web_env, **(env or {})}
    proc: subprocess.Popen[Any] = subprocess.Popen(argv, cwd=REPO, env=child_env)
    server = LiveServer(proc, port)
    try:
        wait_http(server.url + "/api/v1/health", timeout=timeout, proc=proc)
    except Exception:
        server.stop()
        raise
    return server
