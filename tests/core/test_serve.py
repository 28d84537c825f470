"""portal.serve: uvicorn in N processes, each accepting on a socket of its own, so keep-alive connections spread
over all of them (with `uvicorn --workers`, one shared socket, one process could end up with all of them); a
process that dies is replaced; SIGTERM stops them all."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port, subprocess_env, wait_http

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT balancing, /proc")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _servers(pid: int) -> list[int]:
    """The serving children (not multiprocessing's resource tracker)."""
    out = []
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(child)
    return out


def _established(pids: list[int], port: int) -> dict[int, int]:
    """How many established TCP connections on local `port` each process holds (from /proc)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    counts = dict.fromkeys(pids, 0)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01" and fields[9] in inodes:
                counts[inodes[fields[9]]] += 1
    return counts


@pytest.fixture
def served(transactional_db: Any) -> Any:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "portal.serve", "--port", str(port), "--processes", "2", "--log-level", "warning"],
        cwd=REPO,
        env=subprocess_env(),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/health", proc=proc)
        deadline = time.monotonic() + 30
        while len(_servers(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_keep_alive_connections_spread_over_the_processes(served: Any) -> None:
    proc, port = served
    servers = _servers(proc.pid)
    assert len(servers) == 2
    conns = []
    try:
        for _ in range(32):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/api/v1/health")
            conn.getresponse().read()
            conns.append(conn)  # kept open: keep-alive
        counts = _established(servers, port)
        assert sum(counts.values()) == 32
        # By the kernel's hash: 16 ± 3 each; fewer than 4 on one side has a probability below 1e-5.
        assert min(counts.values()) >= 4, counts
    finally:
        for conn in conns:
            conn.close()


def test_a_dead_process_is_replaced_and_sigterm_stops_all(served: Any) -> None:
    proc, port = served
    first = _servers(proc.pid)
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _servers(proc.pid)
        if len(now) == 2 and first[0] not in now:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"not replaced: {_servers(proc.pid)}")
    wait_http(f"http://127.0.0.1:{port}/api/v1/health", proc=proc)
    servers = _servers(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    for pid in servers:
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()


def test_a_port_in_use_fails_at_once_with_a_message(transactional_db: Any) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "portal.serve", "--port", str(port), "--processes", "2"],
            cwd=REPO,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode != 0
    assert "Address already in use" in out.stderr


def test_a_stop_does_not_wait_for_a_websocket_handler_that_never_ends(tmp_path: Path) -> None:
    """A handler still running after its socket closed (a consumer blocked in the channel layer) is cancelled after
    the grace period: SIGTERM stops the server instead of leaving it for a kill."""
    import asyncio

    import websockets

    from portal import serve

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "portal.serve", "--port", str(port), "--log-level", "info",
         "--app", "tests.support.stuck_app:app"],
        cwd=REPO, env=subprocess_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc=proc)

        async def connect_and_leave() -> None:
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws/stuck/", open_timeout=10):
                pass

        asyncio.run(connect_and_leave())
        proc.send_signal(signal.SIGTERM)
        # Generous: the bound under test is SHUTDOWN_GRACE_S; without it the server never exits on its own.
        code = proc.wait(timeout=serve.SHUTDOWN_GRACE_S + 60)
        log = proc.stderr.read() if proc.stderr else ""
        # uvicorn raises the signal again once its shutdown is done, so the exit status is SIGTERM's.
        assert code == -signal.SIGTERM, log
        assert "timeout graceful shutdown exceeded" in log and "Finished server process" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
