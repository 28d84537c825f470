"""What open websockets checking their access again costs the web process (apps/core/socket_access.py).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal_bench_access REDIS_URL=redis://127.0.0.1:6379/14 \\
        .venv/bin/python -m bench.socket_access [--sockets 100,500,1000] [--changes 10]

One web process (uvicorn, the portal's ASGI app, the row cache on as in production) and N `/ws/bookings/` sockets
of one user, signed in by a token, in this process. For each N it prints:

- the web process's CPU for one access change that closes nothing (another user joins and leaves a team: two
  notifications, one check of every open socket), over `--changes` changes, less as long a time idle;
- how long after a commit that ends the user's access (deactivated) every socket is closed: the median and the
  slowest socket.

The database named by DATABASE_URL is dropped and created again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import free_port, fresh_database, tree_cpu_seconds, wait_healthy

REPO = Path(__file__).resolve().parent.parent
SETTLE_S = 3.0  # a change's checks are over well within this (0.2 s settle, then the checks)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench_access")
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")})
    return env


def _seed() -> dict[str, Any]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from apps.accounts import services as accounts
    from apps.accounts.models import Membership, Team

    users = get_user_model().objects
    team = Team.objects.create(slug="lab", name="Lab")
    watcher = users.create_user(username="watcher", password="x")
    Membership.objects.create(user=watcher, team=team)
    other = users.create_user(username="other", password="x")
    _, token = accounts.token_create(user=watcher, name="bench", scopes=["read"], expires_days=1)
    return {"team": team, "watcher": watcher, "other": other, "token": token}


def _start_server(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--ws-per-message-deflate", "false", "--no-access-log", "--lifespan", "off", "--log-level", "warning",
         "--timeout-graceful-shutdown", "2"],
        cwd=REPO, env=env,
    )  # fmt: skip
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc, port


async def _stage(port: int, pid: int, seeded: dict[str, Any], sockets: int, changes: int) -> dict[str, Any]:
    import websockets
    from asgiref.sync import sync_to_async

    from apps.accounts.models import Membership

    url = f"ws://127.0.0.1:{port}/ws/bookings/"
    headers = {"Authorization": f"Bearer {seeded['token']}"}
    open_ = []
    for _ in range(sockets):
        ws = await websockets.connect(url, additional_headers=headers, open_timeout=30, max_size=None)
        await asyncio.wait_for(ws.recv(), 30)  # bookings.watching: joined and registered
        open_.append(ws)
    await asyncio.sleep(SETTLE_S)

    def join_and_leave() -> None:
        Membership.objects.create(user=seeded["other"], team=seeded["team"])
        Membership.objects.filter(user=seeded["other"]).delete()

    # CPU is read in clock ticks (10 ms): measure many changes together against as long a time idle.
    cpu0 = tree_cpu_seconds(pid)
    await asyncio.sleep(changes * SETTLE_S)
    idle = tree_cpu_seconds(pid) - cpu0
    cpu0 = tree_cpu_seconds(pid)
    for _ in range(changes):
        await sync_to_async(join_and_leave)()
        await asyncio.sleep(SETTLE_S)
    changed = tree_cpu_seconds(pid) - cpu0
    if any(ws.close_code is not None for ws in open_):
        raise SystemExit("a socket closed on a change that should close nothing")

    def deactivate() -> float:
        watcher = seeded["watcher"]
        watcher.is_active = False
        watcher.save(update_fields=["is_active"])
        return time.monotonic()

    async def closed_at(ws: Any) -> float:
        await ws.wait_closed()
        return time.monotonic()

    waiting = [asyncio.ensure_future(closed_at(ws)) for ws in open_]
    committed = await sync_to_async(deactivate)()
    ends = await asyncio.wait_for(asyncio.gather(*waiting), 120)
    codes = {ws.close_code for ws in open_}
    await sync_to_async(
        lambda: type(seeded["watcher"]).objects.filter(pk=seeded["watcher"].pk).update(is_active=True)
    )()
    lags = sorted(end - committed for end in ends)
    return {
        "sockets": sockets,
        "cpu_ms_per_change": (changed - idle) / changes * 1000,
        "close_p50_ms": lags[len(lags) // 2] * 1000,
        "close_max_ms": lags[-1] * 1000,
        "codes": sorted(c for c in codes if c is not None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", default="100,500,1000")
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    env = _env()
    fresh_database(env["DATABASE_URL"])
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    seeded = _seed()
    for n in (int(x) for x in args.sockets.split(",")):
        proc, port = _start_server(env)
        try:
            r = asyncio.run(_stage(port, proc.pid, seeded, n, args.changes))
        finally:
            proc.terminate()
            proc.wait(30)
        print(
            f"{r['sockets']:>5} sockets: one access change {r['cpu_ms_per_change']:7.1f} ms web CPU "
            f"({r['cpu_ms_per_change'] / r['sockets'] * 1000:5.0f} µs per socket); access ended: all closed in "
            f"{r['close_max_ms']:6.0f} ms (median socket {r['close_p50_ms']:5.0f} ms), codes {r['codes']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
