"""What the load benchmarks share: a free port, waiting for the web server's health check, a throwaway database,
a process tree's CPU time and a percentile. Standard library and psycopg only, so every benchmark can import it
before Django is configured."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until `url`/api/v1/health answers (any HTTP status: the server is up); SystemExit if `proc` exits first or
    nothing answers in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"web server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/api/v1/health", timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit("web server did not answer")


def database_name(database_url: str) -> str:
    return urllib.parse.urlparse(database_url).path.lstrip("/")


def _admin_url(database_url: str) -> str:
    return urllib.parse.urlparse(database_url)._replace(path="/postgres").geturl()


def fresh_database(database_url: str) -> None:
    """Drop the URL's database (closing its sessions) and create it empty."""
    import psycopg

    name = database_name(database_url)
    with psycopg.connect(_admin_url(database_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(database_url: str) -> None:
    import psycopg

    with psycopg.connect(_admin_url(database_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database_name(database_url)}" WITH (FORCE)')


def tree_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process and its children (the web server's workers), from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
