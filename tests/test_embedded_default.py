"""The embedded default, started as a subprocess from a fresh checkout: the embedded PostgreSQL server runs, the
portal is healthy, the login works, the booking guarantees hold (a 50-way race for one GPU and hour has one
winner), manage.py commands work beside it and without it, and Ctrl-C stops everything, the database included."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from http.cookiejar import CookieJar
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, free_port, wait_http

pytestmark = pytest.mark.slow


def _fresh_checkout(dest: Path) -> None:
    """Committed and working-tree files (what `git clone` would give after commit), no var/, no .venv."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    # The front-end build is an output of `make`; reuse it rather than running npm inside the test.
    if (REPO / "frontend" / "dist").exists():
        shutil.copytree(REPO / "frontend" / "dist", dest / "frontend" / "dist")


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def _manage(checkout: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _postmaster_alive(checkout: Path) -> bool:
    pid_file = checkout / "var" / "postgres" / "postmaster.pid"
    if not pid_file.exists():
        return False
    return Path(f"/proc/{pid_file.read_text().split()[0]}").exists()


def _race_one_gpu(base: str, token: str) -> list[int]:
    """50 parallel bookings of one GPU for one hour: the statuses."""
    gpus = requests.get(f"{base}/api/v1/gpus/", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
    gpu = gpus["results"][0]["uuid"]
    start = (datetime.now(UTC) + timedelta(days=20)).replace(minute=0, second=0, microsecond=0)
    body = {
        "team": "vision",
        "gpus": [gpu],
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }
    barrier = threading.Barrier(50)
    statuses: list[int] = []

    def book() -> None:
        session = requests.Session()
        barrier.wait()
        resp = session.post(
            f"{base}/api/v1/reservations/", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        statuses.append(resp.status_code)

    threads = [threading.Thread(target=book) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_embedded_default_runs_and_stops_cleanly(tmp_path):
    checkout = tmp_path / "checkout"
    _fresh_checkout(checkout)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "PORTAL_VAR_DIR"}}
    # manage.py without make run: it starts the embedded server (initdb on first use), migrates, and stops it.
    _manage(checkout, env, "migrate", "--noinput", "-v", "0")
    assert (checkout / "var" / "postgres" / "PG_VERSION").exists()
    assert not _postmaster_alive(checkout), "a manage.py command left the server it started running"
    env["PORT"] = str(port)
    log = (tmp_path / "launcher.log").open("wb")
    # A process group of its own, as a terminal gives `make run`: Ctrl-C goes to the whole group.
    proc = subprocess.Popen(
        [sys.executable, "-m", "portal.launcher"],
        cwd=checkout,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/health", timeout=120, proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=5) as resp:
            assert resp.status == 200
            assert b'"database":"ok"' in resp.read().replace(b" ", b"")
        # The embedded PostgreSQL's data under var/ of the checkout, the embedded Redis socket there too.
        assert _postmaster_alive(checkout)
        assert (checkout / "var" / "run" / "redis.sock").exists()
        # manage.py beside make run: connects to the running server and leaves it running.
        token = _manage(checkout, env, "create_token", "alice", "--scope", "read", "--scope", "reservations:write")
        assert _postmaster_alive(checkout)
        # The exclusion constraint and locks hold in the demo: exactly one of 50 parallel bookings wins.
        statuses = _race_one_gpu(f"http://127.0.0.1:{port}", token)
        assert sorted(statuses).count(201) == 1, statuses
        assert set(statuses) <= {201, 409}, statuses
        # Sign in as the printed admin.
        deadline = time.monotonic() + 30
        while b"Sign in as admin / demo" not in (tmp_path / "launcher.log").read_bytes():
            assert time.monotonic() < deadline, "login banner not printed"
            time.sleep(0.2)
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(f"http://127.0.0.1:{port}/accounts/login/", timeout=10).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode({"username": "admin", "password": "demo", "csrfmiddlewaretoken": csrf}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/accounts/login/",
            data=data,
            headers={"Referer": f"http://127.0.0.1:{port}/accounts/login/"},
        )
        home = opener.open(req, timeout=10).read().decode()
        assert "Welcome, admin" in home
        children = _descendants(proc.pid)
        assert len(children) >= 3
        # The portal's processes know its address, so mails link to their pages.
        environs = []
        for pid in children:
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            except OSError:
                pass
        assert any(f"PORTAL_URL=http://127.0.0.1:{port}".encode() in e for e in environs)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: to every process in the foreground group
        try:
            code = proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    output = (tmp_path / "launcher.log").read_text()
    assert code == 0, output[-3000:]
    # Stopped in dependency order (the portal's processes, then Redis, then PostgreSQL): nothing lost a server it
    # still used, so no child printed an error on the way out.
    assert "Traceback" not in output, output[-6000:]
    assert output.rstrip().endswith("[launcher] stopped"), output[-3000:]
    # The console stays readable: no Celery banner after the portal's own, no line per task (TASK_LOG_LEVEL), though
    # beat sent tasks every few seconds all along.
    assert "[queues]" not in output and "beat: Starting" not in output, output[-3000:]
    assert "Sending due task" not in output and " succeeded in " not in output, output[-3000:]

    def still_running() -> list[int]:
        out = []
        for pid in children:
            try:
                if "zombie" not in Path(f"/proc/{pid}/status").read_text().lower():
                    out.append(pid)
            except OSError:
                pass
        return out

    # The launcher waits for each child (a process group leader) and signals the whole group; a grandchild (a
    # worker's pool process) may still be finishing its SIGTERM when the launcher returns: give them 15 s, not
    # 0.5 s (a slow boot of the CI machine took longer), and still fail on any that stays.
    deadline = time.monotonic() + 15
    while still_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = still_running()
    assert alive == [], f"children left running: {alive}"
    assert not _postmaster_alive(checkout), "Ctrl-C left the embedded PostgreSQL running"
