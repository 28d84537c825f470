"""Booking throughput on PostgreSQL: concurrent POST /api/v1/reservations/, about half of them conflicting.

    .venv/bin/python -m bench.booking_load [--duration 60] [--concurrency 32] [--conflict 0.5]
        [--server wsgi|asgi] [--workers 2] [--teams 8] [--gpus 128] [--database-url URL] [--redis-url URL]

It creates a fresh database (the name in --database-url, dropped first), migrates it, seeds teams, users, tokens
and GPUs (nodes of 8), starts the web tier as its own processes (uvicorn: `wsgi` = Django's WSGI app on uvicorn's
threaded WSGI interface, `asgi` (default) = the ASGI app as shipped, with the launcher's connection pool), then
runs `--concurrency` keep-alive HTTP/1.1 clients (a small asyncio client, no third-party HTTP library) for
`--duration` seconds. Each request books one named GPU for one hour: with probability `--conflict` a cell (GPU,
hour) already booked, exactly or shifted by half an hour (a partial overlap), which must get 409; otherwise a fresh
cell, which must get 201. Every team has a quota (large
enough not to refuse), so each booking takes the team's quota row lock as in production.

Prints successful bookings/s, all requests/s, p50/p99 latency (all, 201, 409), the status mix, then an SQL audit:
no two active allocations of one GPU overlap, one reservation per 201, one allocation per reservation, the quota
counters equal the booked hours. Exit 1 if the audit fails. `--keep` keeps the database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.procs import database_name, drop_database, fresh_database, tree_cpu_seconds, wait_healthy

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/portal_bench_booking"
DEFAULT_REDIS = "redis://127.0.0.1:6379/3"


# --- Seeding (runs inside Django: `python -m bench.booking_load seed`) ---------------------------------------


def seed(teams: int, gpus: int) -> dict[str, Any]:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from decimal import Decimal

    from apps.accounts import services as accounts
    from apps.accounts.models import Role
    from apps.booking.models import BookingPolicy, Quota
    from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus

    BookingPolicy.objects.get_or_create(pk=1)
    model, _ = GpuModel.objects.get_or_create(
        name="A100-80GB", defaults={"memory_mib": 81920, "hourly_price": Decimal("2.2")}
    )
    uuids = []
    for n in range((gpus + 7) // 8):
        node = Node.objects.create(name=f"bench-{n:03d}", status=NodeStatus.ONLINE)
        rows = [
            Gpu(
                uuid=f"GPU-bench-{n:03d}-{i}",
                node=node,
                index=i,
                model=model,
                memory_mib=81920,
                status=GpuStatus.OK,
            )
            for i in range(min(8, gpus - 8 * n))
        ]
        Gpu.objects.bulk_create(rows)
        uuids += [g.uuid for g in rows]
    admin = accounts.user_get_or_create(username="bench-admin", password="x" * 20, is_staff=True)
    out_teams = []
    for t in range(teams):
        team = accounts.team_create(actor=admin, slug=f"team{t:02d}", name=f"Team {t}")
        Quota.objects.create(team=team, gpu_hours=Decimal("1000000"), budget_hard=Decimal("100000000"))
        tokens = []
        for u in range(4):
            user = accounts.user_get_or_create(username=f"t{t:02d}u{u}", password="x" * 20)
            accounts.membership_set(actor=admin, team=team, user=user, role=Role.MEMBER)
            _, plaintext = accounts.token_create(
                user=user, name="bench", scopes=["read", "reservations:write"], expires_days=1
            )
            tokens.append(plaintext)
        out_teams.append({"slug": team.slug, "tokens": tokens})
    return {"teams": out_teams, "gpus": uuids}


# --- A minimal asyncio HTTP/1.1 client ------------------------------------------------------------------------


class Client:
    """One keep-alive connection; reconnects after a failure."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            self.writer.write(head.encode() + body)
            status_line = await self.reader.readline()
            status = int(status_line.split()[1])
            length, chunked, close = 0, False, False
            while True:
                line = await self.reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "transfer-encoding" and "chunked" in value.lower():
                    chunked = True
                elif name == "connection" and "close" in value.lower():
                    close = True
            if chunked:
                data = b""
                while True:
                    size = int((await self.reader.readline()).strip(), 16)
                    chunk = await self.reader.readexactly(size + 2)
                    if size == 0:
                        break
                    data += chunk[:-2]
            else:
                data = await self.reader.readexactly(length)
            if close:
                await self.close()
            return status, data
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            await self.close()
            return 0, b""

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# --- The load ---------------------------------------------------------------------------------------------------


class Plan:
    """Which cell (GPU, hour) each request books: fresh ones in order, or (conflicts) ones already booked."""

    def __init__(self, gpus: list[str], conflict: float, base: datetime, seed: int = 1) -> None:
        self.gpus = gpus
        self.conflict = conflict
        self.base = base
        self.next_cell = 0
        self.booked: list[int] = []
        self.rng = random.Random(seed)

    def cell_window(self, cell: int, shift_min: int = 0) -> tuple[str, datetime, datetime]:
        gpu = self.gpus[cell % len(self.gpus)]
        start = self.base + timedelta(hours=cell // len(self.gpus), minutes=shift_min)
        return gpu, start, start + timedelta(hours=1)

    def next(self) -> tuple[bool, int, str, datetime, datetime]:
        if self.booked and self.rng.random() < self.conflict:
            cell = self.rng.choice(self.booked)
            shift = self.rng.choice([0, 0, 30, -30])
            gpu, start, end = self.cell_window(cell, shift)
            return True, cell, gpu, start, end
        cell = self.next_cell
        self.next_cell += 1
        gpu, start, end = self.cell_window(cell)
        return False, cell, gpu, start, end


async def run_load(
    url: str, seeded: dict[str, Any], *, duration: float, concurrency: int, conflict: float
) -> dict[str, Any]:
    parsed = urllib.parse.urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    base = (datetime.now(UTC) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    plan = Plan(seeded["gpus"], conflict, base)
    teams = seeded["teams"]
    latencies: dict[str, list[float]] = {"all": [], "201": [], "409": []}
    statuses: Counter[int] = Counter()
    unexpected: Counter[str] = Counter()
    stop_at = time.monotonic() + duration
    rng = random.Random(2)

    async def worker(n: int) -> None:
        client = Client(host, port)
        while time.monotonic() < stop_at:
            is_conflict, cell, gpu, start, end = plan.next()
            team = teams[rng.randrange(len(teams))]
            token = team["tokens"][rng.randrange(len(team["tokens"]))]
            body = json.dumps(
                {"team": team["slug"], "gpus": [gpu], "start": start.isoformat(), "end": end.isoformat()}
            ).encode()
            t0 = time.perf_counter()
            status, data = await client.request("POST", "/api/v1/reservations/", token, body)
            dt = time.perf_counter() - t0
            statuses[status] += 1
            latencies["all"].append(dt)
            if status in (201, 409):
                latencies[str(status)].append(dt)
            if status == 201:
                if is_conflict:
                    unexpected["201 for a conflicting request"] += 1
                else:
                    plan.booked.append(cell)
            elif status == 409 and not is_conflict:
                unexpected["409 for a fresh cell"] += 1
            elif status not in (201, 409):
                unexpected[f"{status}: {data[:200]!r}"] += 1
        await client.close()

    t_start = time.monotonic()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    elapsed = time.monotonic() - t_start

    def pct(values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {
        "elapsed_s": round(elapsed, 2),
        "requests": sum(statuses.values()),
        "bookings": statuses[201],
        "bookings_per_s": round(statuses[201] / elapsed, 1),
        "requests_per_s": round(sum(statuses.values()) / elapsed, 1),
        "conflict_share": round(statuses[409] / max(1, sum(statuses.values())), 3),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "latency_ms": {kind: {"p50": pct(v, 0.50), "p99": pct(v, 0.99)} for kind, v in latencies.items() if v},
        "unexpected": dict(unexpected),
    }


# --- Database, server, audit ---------------------------------------------------------------------------------


def audit(database_url: str, bookings: int) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        overlaps = conn.execute(
            """SELECT count(*) FROM booking_allocation a JOIN booking_allocation b
               ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.active AND b.active
               AND a.start < b."end" AND b.start < a."end" """
        ).fetchone()[0]
        reservations = conn.execute("SELECT count(*) FROM booking_reservation").fetchone()[0]
        allocations = conn.execute("SELECT count(*) FROM booking_allocation WHERE active").fetchone()[0]
        orphans = conn.execute(
            """SELECT count(*) FROM booking_reservation r WHERE NOT EXISTS
               (SELECT 1 FROM booking_allocation a WHERE a.reservation_id = r.id)"""
        ).fetchone()[0]
        usage = conn.execute("SELECT coalesce(sum(gpu_hours), 0) FROM booking_quotausage").fetchone()[0]
        held = conn.execute(
            """SELECT coalesce(sum(extract(epoch FROM ("end" - start)) / 3600), 0)
               FROM booking_allocation WHERE active"""
        ).fetchone()[0]
    result = {
        "overlapping_pairs": overlaps,
        "reservations": reservations,
        "answered_201": bookings,
        "active_allocations": allocations,
        "reservations_without_allocations": orphans,
        "quota_gpu_hours": str(usage),
        "allocated_gpu_hours": f"{float(held):.4f}",
    }
    result["ok"] = (
        overlaps == 0
        and reservations == bookings
        and allocations == bookings
        and orphans == 0
        and abs(float(usage) - float(held)) < 0.01
    )
    return result


def start_server(kind: str, workers: int, port: int, env: dict[str, str], quiet: bool) -> subprocess.Popen[bytes]:
    common = ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--no-access-log"]
    common += ["--log-level", "warning", "--http", "httptools", "--loop", "uvloop"]
    if kind == "asgi":
        # What the portal ships: portal.serve, a socket per process (uvicorn --workers shares one, and the
        # keep-alive clients then landed unevenly: 29/3, 32/0).
        argv = [PY, "-m", "portal.serve", "--host", "127.0.0.1", "--port", str(port), "--processes", str(workers)]
        argv += ["--log-level", "warning"]
    elif kind == "wsgi":
        argv = [PY, "-m", "uvicorn", "portal.wsgi:application", "--interface", "wsgi", *common]
    else:
        raise SystemExit(f"unknown server {kind!r}")
    # Quiet: every 409 is logged as a warning by Django's request logger, which would flood the terminal.
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=["run", "seed"])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--conflict", type=float, default=0.5, help="share of requests aimed at booked cells")
    parser.add_argument("--server", choices=["wsgi", "asgi"], default="asgi")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--teams", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true", help="print one JSON document at the end")
    parser.add_argument("--verbose", action="store_true", help="show the server's log")
    args = parser.parse_args()

    if args.command == "seed":
        print(json.dumps(seed(args.teams, args.gpus)))
        return 0

    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING" if args.verbose else "ERROR",
        # Persistent connections for the threaded WSGI server; the ASGI app gets the connection pool the launcher
        # and compose give the web process (without it, a new PostgreSQL connection per request: the shipped
        # configuration does not do that, and the backends' start-up was most of PostgreSQL's CPU here).
        "DB_CONN_MAX_AGE": "600" if args.server == "wsgi" else "0",
        # The throttle would cap one client IP at 200 requests/s; this measures booking, not the throttle.
        "API_RATE_PER_IP": "10000000/min",
        "API_RATE_PER_TOKEN": "10000000/min",
        "PYTHONUNBUFFERED": "1",
    }
    if args.server == "asgi":
        from portal.launcher import web_pool_size

        env["DB_POOL_MAX_SIZE"] = os.environ.get("DB_POOL_MAX_SIZE") or str(web_pool_size(env))
    print(f"fresh database {database_name(args.database_url)}; migrating and seeding...", flush=True)
    fresh_database(args.database_url)
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
    out = subprocess.run(
        [PY, "-m", "bench.booking_load", "seed", "--teams", str(args.teams), "--gpus", str(args.gpus)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    seeded = json.loads(out.stdout.strip().splitlines()[-1])

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args.server, args.workers, port, env, quiet=not args.verbose)
    try:
        wait_healthy(url, proc)
        print(
            f"server: uvicorn {args.server}, {args.workers} workers; clients: {args.concurrency} for "
            f"{args.duration:.0f} s, conflict share {args.conflict}",
            flush=True,
        )
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        from bench.jobs_e2e import cpu_of_command

        server_cpu0, client_cpu0 = tree_cpu_seconds(proc.pid), time.process_time()
        pg_cpu0, redis_cpu0 = cpu_of_command(b"postgres"), cpu_of_command(b"redis-server")
        result = asyncio.run(
            run_load(url, seeded, duration=args.duration, concurrency=args.concurrency, conflict=args.conflict)
        )
        n = max(1, result["requests"])
        result["cpu_ms_per_request"] = {
            "server": round((tree_cpu_seconds(proc.pid) - server_cpu0) * 1000 / n, 2),
            "client": round((time.process_time() - client_cpu0) * 1000 / n, 2),
            # Every PostgreSQL and Redis process on this host: run the bench alone for these to mean anything.
            "postgres": round((cpu_of_command(b"postgres") - pg_cpu0) * 1000 / n, 2),
            "redis": round((cpu_of_command(b"redis-server") - redis_cpu0) * 1000 / n, 2),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["audit"] = audit(args.database_url, result["bookings"])
    result["config"] = {k: v for k, v in vars(args).items() if k not in {"command", "json", "database_url"}}
    if not args.keep:
        drop_database(args.database_url)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lat = result["latency_ms"]
        print(f"successful bookings/s: {result['bookings_per_s']}  (requests/s {result['requests_per_s']})")
        print(f"requests: {result['requests']}  statuses: {result['statuses']}  409 share: {result['conflict_share']}")
        for kind, v in lat.items():
            print(f"latency {kind:>3}: p50 {v['p50']} ms  p99 {v['p99']} ms")
        cpu = result["cpu_ms_per_request"]
        print(
            f"CPU per request: server {cpu['server']} ms, PostgreSQL {cpu['postgres']} ms, "
            f"Redis {cpu['redis']} ms, client {cpu['client']} ms"
        )
        if result["unexpected"]:
            print(f"unexpected answers: {result['unexpected']}")
        print(f"audit: {json.dumps(result['audit'])}")
    return 0 if result["audit"]["ok"] and not result["unexpected"] else 1


if __name__ == "__main__":
    sys.exit(main())
