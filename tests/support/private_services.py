"""A private PostgreSQL cluster and a private redis-server, for fault tests that stop and restart them.

The shared servers other tests use are never touched: each helper starts its own process on a free port in a
temporary directory and stops only that. PostgreSQL comes from the same wheel as the embedded default (so these
tests run on a machine without a PostgreSQL package); as root it runs as the wheel's system user, because initdb
refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from portal.embedded_db import bin_dir, prepare_for_server_user, server_user


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, *, up: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            is_up = s.connect_ex(("127.0.0.1", port)) == 0
        if is_up == up:
            return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} not {'up' if up else 'down'} after {timeout}s")


class PrivatePostgres:
    """initdb + pg_ctl in a temp dir owned by `postgres`; trust auth on 127.0.0.1 only; fsync off (tests)."""

    def __init__(self, max_connections: int = 200) -> None:
        self.max_connections = max_connections
        self.bindir = bin_dir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="portal-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        prepare_for_server_user(self.root)
        os.chmod(self.root, 0o700)
        self._as_postgres(
            str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--locale", "C", "--no-sync",
        )  # fmt: skip

    def _as_postgres(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            user=server_user(),
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 30) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c max_connections={self.max_connections} -c superuser_reserved_connections=3"
        )
        self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w",
            "-t", str(int(timeout)), "start",
        )  # fmt: skip
        _wait_port(self.port, timeout)

    def stop(self, mode: str = "immediate") -> None:
        """`immediate` is what a crash or a kill looks like to clients: connections drop without goodbye."""
        self._as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)
        _wait_port(self.port, 30, up=False)

    def createdb(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


class PrivateRedis:
    """A redis-server child on a free port, no persistence; restartable on the same port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="portal-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 10) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        _wait_port(self.port, 10, up=False)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()
