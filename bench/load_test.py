"""Load test: N concurrent API clients against a real portal on PostgreSQL and Redis, then an SQL audit.

    python -m bench.load_test --clients 200 --duration 300

It starts a private PostgreSQL cluster and redis-server for the run (or uses `--database-url` / `--redis-url`),
creates a fresh database, migrates it, seeds teams, users, tokens, GPU models, nodes, GPUs and an allowed image,
starts the web tier (portal.serve with the launcher's arguments, `--workers` processes) and runs the clients: each
keeps one HTTP/1.1 connection and loops over a weighted mix of reads (me, teams, gpus, reservation and job
lists), bookings and job submissions. It prints requests/s, p50/p99 latency per kind, error rate and 5xx count,
then audits the database: no two active allocations overlap on a GPU, no duplicate ledger rows, every booking
answered 201 exists with all its allocation rows and no reservation lacks them. The database is dropped
afterwards unless `--keep`.

`python -m bench.load_test seed ...` is the seeding step alone (run by the above inside Django; tests use it).
No third-party HTTP client: a small asyncio HTTP/1.1 client (keep-alive, Content-Length and chunked bodies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.parse
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.procs import free_port, pct, wait_healthy

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

# --- A minimal asyncio HTTP/1.1 client ------------------------------------------------------------------


class HttpError(Exception):
    """The connection failed or the answer was not HTTP."""


class Connection:
    """One keep-alive connection; reconnects on the next request after any failure."""

    def __init__(self, host: str, port: int, timeout: float = 30.0, idle_close_s: float = 4.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        # uvicorn closes a keep-alive connection idle for 5 s; a request sent at that moment meets a reset. Like
        # the idle timeout of HTTP client pools (Go's IdleConnTimeout, browsers), drop ours a second before.
        self.idle_close_s = idle_close_s
        self.last_used = 0.0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except Exception:  # noqa: S110 - already gone
                pass
        self.reader = self.writer = None

    async def request(
        self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._request(method, path, body, headers or {}), self.timeout)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError, HttpError) as exc:
            await self.close()
            raise HttpError(f"{exc.__class__.__name__}: {exc}") from exc

    async def _request(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.reader is not None and self.reader.at_eof():
            # The server closed the idle keep-alive connection (uvicorn: after 5 s): open a new one, as every
            # HTTP client's pool does, rather than write into a closed socket and count an error.
            await self.close()
        if self.writer is not None and time.monotonic() - self.last_used > self.idle_close_s:
            await self.close()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None and self.writer is not None
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Accept: application/json"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("connection closed before the status line")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise HttpError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        close = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.lower() == "close":
                close = True
        if chunked:
            data = bytearray()
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                data += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            content = bytes(data)
        elif length is not None:
            content = await self.reader.readexactly(length)
        else:
            content = await self.reader.read()
            close = True
        self.last_used = time.monotonic()
        if close:
            await self.close()
        return status, content


# --- Seeding (inside Django) ---------------------------------------------------------------------------


def seed(*, teams: int, users_per_team: int, nodes: int, gpus_per_node: int, staff: int = 1) -> dict[str, Any]:
    """Teams, users (member/manager), tokens with every scope, GPU models, nodes, GPUs, an allowed image.

    Returns {"users": [{"username", "token", "teams": [...], "is_staff"}], "models": [...], "gpus": [...],
    "image": name}. Idempotent enough for a fresh database; not for reuse.
    """
    import django

    django.setup()
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    from apps.accounts import services as account_services
    from apps.accounts.models import Membership, Role, Team
    from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus

    User = get_user_model()
    password = make_password("load-test-password")
    models = [
        GpuModel.objects.get_or_create(
            name=name, defaults={"display_name": name, "memory_mib": mem, "hourly_price": Decimal(price)}
        )[0]
        for name, mem, price in (("A100-80GB", 81920, "2.50"), ("H100-80GB", 81920, "4.00"))
    ]
    gpus: list[str] = []
    for n in range(nodes):
        node = Node.objects.get_or_create(name=f"load-node-{n:03d}", defaults={"status": NodeStatus.ONLINE})[0]
        Node.objects.filter(pk=node.pk).update(status=NodeStatus.ONLINE)
        model = models[n % len(models)]
        for i in range(gpus_per_node):
            gpu = Gpu.objects.create(
                node=node, index=i, model=model, memory_mib=model.memory_mib, status=GpuStatus.OK,
                uuid=f"GPU-load{n:04d}-{i:04d}-0000-0000-000000000000",
            )  # fmt: skip
            gpus.append(gpu.uuid)
    image = ""
    try:
        from apps.jobs.models import ContainerImage

        image = ContainerImage.objects.get_or_create(name="portal-test/busybox:latest")[0].name
    except Exception:  # noqa: S110 - the jobs app is not installed: no job submissions
        pass
    users: list[dict[str, Any]] = []
    all_scopes = ["read", "jobs:write", "reservations:write"]
    for t in range(teams):
        team = Team.objects.get_or_create(slug=f"load{t:02d}", defaults={"name": f"Load team {t}"})[0]
        for u in range(users_per_team):
            user = User.objects.create(username=f"load{t:02d}u{u:02d}", password=password)
            Membership.objects.create(user=user, team=team, role=Role.MANAGER if u == 0 else Role.MEMBER)
            _, token = account_services.token_create(user=user, name="load", scopes=all_scopes, expires_days=30)
            users.append({"username": user.username, "token": token, "teams": [team.slug], "is_staff": False})
    for s in range(staff):
        user = User.objects.create(username=f"loadadmin{s}", password=password, is_staff=True, is_superuser=True)
        _, token = account_services.token_create(user=user, name="load", scopes=[*all_scopes, "admin"], expires_days=30)
        users.append({"username": user.username, "token": token, "teams": [], "is_staff": True})
    return {"users": users, "models": [m.name for m in models], "gpus": gpus, "image": image}


def run_seed(env: dict[str, str], **kwargs: int) -> dict[str, Any]:
    """`seed()` in a child process with `env` (DATABASE_URL...); returns what it printed."""
    argv = [PY, "-m", "bench.load_test", "seed"] + [f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]
    out = subprocess.run(argv, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- The clients -----------------------------------------------------------------------------------------


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    transport_errors: Counter[str] = field(default_factory=Counter)
    booked: list[tuple[int, int]] = field(default_factory=list)  # (reservation id, gpu_count) answered 201
    submitted: list[int] = field(default_factory=list)

    def record(self, kind: str, status: int, seconds: float) -> None:
        self.latencies[kind].append(seconds)
        self.statuses[kind][status] += 1


# kind -> weight. Reads dominate, as on a real portal; bookings and submissions are the contended writes.
DEFAULT_MIX = {
    "me": 10,
    "teams": 8,
    "gpus": 10,
    "reservations": 10,
    "jobs": 8,
    "book": 12,
    "submit": 6,
}
# Statuses that are a correct refusal under load, not an error: a lost race (409), a full quota (403).
EXPECTED_REFUSALS = {"book": {409, 403}, "submit": {409, 403}}


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def booking_body(rng: random.Random, team: str, models: list[str], horizon_days: int) -> dict[str, Any]:
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = base + timedelta(minutes=15 * rng.randrange(horizon_days * 24 * 4))
    end = start + timedelta(minutes=15 * rng.randint(2, 16))
    return {
        "team": team,
        "gpu_count": rng.choice((1, 1, 1, 2, 2, 4)),
        "gpu_model": rng.choice(models),
        "start": _iso(start),
        "end": _iso(end),
        "note": "load",
    }


async def client_loop(
    n: int,
    url: str,
    user: dict[str, Any],
    seeded: dict[str, Any],
    mix: dict[str, int],
    stop_at: float,
    stats: Stats,
    horizon_days: int,
    think: float = 0.0,
) -> None:
    parsed = urllib.parse.urlsplit(url)
    conn = Connection(parsed.hostname or "127.0.0.1", parsed.port or 80)
    rng = random.Random(n)
    kinds = [k for k in mix if mix[k] > 0 and (k != "submit" or seeded.get("image"))]
    weights = [mix[k] for k in kinds]
    headers = {"Authorization": f"Bearer {user['token']}"}
    team = user["teams"][0] if user["teams"] else None
    paths = {
        "me": "/api/v1/me",
        "teams": "/api/v1/teams/",
        "gpus": "/api/v1/gpus/",
        "reservations": "/api/v1/reservations/",
        "jobs": "/api/v1/jobs/",
    }
    if think > 0:
        # Clients start spread over one think time rather than all at once.
        await asyncio.sleep(rng.uniform(0, think))
    while time.monotonic() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        if kind in {"book", "submit"} and team is None:
            kind = "gpus"
        method, path, body = "GET", paths.get(kind, ""), None
        if kind == "book":
            method, path = "POST", "/api/v1/reservations/"
            body = booking_body(rng, team or "", seeded["models"], horizon_days)
        elif kind == "submit":
            method, path = "POST", "/api/v1/jobs/"
            body = {
                "team": team,
                "name": f"load-{n}",
                "image": seeded["image"],
                "command": ["sleep", "1"],
                "gpu_count": 1,
                "max_duration_s": 600,
            }
        began = time.perf_counter()
        try:
            status, content = await conn.request(method, path, body=body, headers=headers)
        except HttpError as exc:
            stats.transport_errors[str(exc).split(":")[0]] += 1
            stats.record(kind, 0, time.perf_counter() - began)
            await asyncio.sleep(0.2)
            continue
        stats.record(kind, status, time.perf_counter() - began)
        if status == 201 and kind == "book":
            doc = json.loads(content)
            stats.booked.append((int(doc["id"]), int(doc.get("gpu_count") or len(doc.get("gpus") or []))))
        elif status in {201, 202} and kind == "submit":
            stats.submitted.append(int(json.loads(content)["id"]))
        if think > 0:
            # A person or a CI job between two calls: exponential, mean `think` s (locust's between-task wait).
            await asyncio.sleep(min(rng.expovariate(1 / think), 10 * think))
    await conn.close()


async def run_clients(
    url: str,
    seeded: dict[str, Any],
    *,
    clients: int,
    duration: float,
    mix: dict[str, int],
    horizon_days: int,
    think: float = 0.0,
) -> tuple[Stats, float]:
    stats = Stats()
    users = seeded["users"]
    began = time.monotonic()
    stop_at = began + duration
    await asyncio.gather(
        *(
            client_loop(n, url, users[n % len(users)], seeded, mix, stop_at, stats, horizon_days, think)
            for n in range(clients)
        )
    )
    return stats, time.monotonic() - began


def report(stats: Stats, elapsed: float) -> dict[str, Any]:
    total = sum(len(v) for v in stats.latencies.values())
    errors = 0
    five_xx = 0
    print(f"\n{'kind':<14}{'count':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}  statuses")
    for kind in sorted(stats.latencies):
        lat = stats.latencies[kind]
        counts = stats.statuses[kind]
        for status, count in counts.items():
            if status >= 500 or status == 0:
                errors += count
                five_xx += count if status >= 500 else 0
            elif status >= 400 and status not in EXPECTED_REFUSALS.get(kind, set()):
                errors += count
        histogram = " ".join(f"{s}:{c}" for s, c in sorted(counts.items()))
        print(
            f"{kind:<14}{len(lat):>8}{len(lat) / elapsed:>9.1f}{pct(lat, 0.5) * 1000:>9.1f}"
            f"{pct(lat, 0.99) * 1000:>9.1f}  {histogram}"
        )
    reads = [x for kind, v in stats.latencies.items() if kind not in {"book", "submit"} for x in v]
    print(f"{'reads':<14}{len(reads):>8}{len(reads) / elapsed:>9.1f}{pct(reads, 0.5) * 1000:>9.1f}"
          f"{pct(reads, 0.99) * 1000:>9.1f}")  # fmt: skip
    everything = [x for v in stats.latencies.values() for x in v]
    print(
        f"{'all':<14}{total:>8}{total / elapsed:>9.1f}{pct(everything, 0.5) * 1000:>9.1f}"
        f"{pct(everything, 0.99) * 1000:>9.1f}"
    )
    rate = errors / total if total else 0.0
    print(
        f"\nerror rate {rate:.4%} ({errors} of {total}); 5xx: {five_xx}; "
        f"transport errors: {dict(stats.transport_errors)}"
    )
    print(f"bookings answered 201: {len(stats.booked)}; jobs accepted: {len(stats.submitted)}")
    return {
        "requests": total,
        "rps": total / elapsed,
        "errors": errors,
        "five_xx": five_xx,
        "error_rate": rate,
        "reads_p99_s": pct(reads, 0.99),
    }


# --- Audit -----------------------------------------------------------------------------------------------


def audit(database_url: str, booked: list[tuple[int, int]]) -> list[str]:
    """Problems found in the database after the run (empty: all invariants hold)."""
    import psycopg

    problems: list[str] = []
    with psycopg.connect(database_url) as conn:
        overlaps = conn.execute(
            """SELECT count(*) FROM booking_allocation a JOIN booking_allocation b
                 ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.active AND b.active
                AND tstzrange(a.start, a."end", '[)') && tstzrange(b.start, b."end", '[)')"""
        ).fetchone()
        if overlaps and overlaps[0]:
            problems.append(f"{overlaps[0]} pairs of active allocations overlap on one GPU")
        has_ledger = conn.execute("SELECT to_regclass('billing_usagerecord') IS NOT NULL").fetchone()
        if has_ledger and has_ledger[0]:
            dup = conn.execute(
                """SELECT count(*) FROM (SELECT 1 FROM billing_usagerecord
                    GROUP BY source, source_id, gpu_id, start HAVING count(*) > 1) d"""
            ).fetchone()
            if dup and dup[0]:
                problems.append(f"{dup[0]} duplicate ledger pieces")
        ids = [rid for rid, _ in booked]
        if ids:
            rows = dict(
                conn.execute(
                    """SELECT r.id, count(a.id) FROM booking_reservation r
                         LEFT JOIN booking_allocation a ON a.reservation_id = r.id
                        WHERE r.id = ANY(%s) GROUP BY r.id""",
                    (ids,),
                ).fetchall()
            )
            missing = [rid for rid in ids if rid not in rows]
            if missing:
                problems.append(f"{len(missing)} bookings answered 201 do not exist, e.g. {missing[:5]}")
            short = [rid for rid, count in booked if rid in rows and rows[rid] != count]
            if short:
                problems.append(f"{len(short)} bookings answered 201 lack allocation rows, e.g. {short[:5]}")
        half = conn.execute(
            """SELECT count(*) FROM booking_reservation r
                WHERE r.gpu_count <> (SELECT count(*) FROM booking_allocation a WHERE a.reservation_id = r.id)"""
        ).fetchone()
        if half and half[0]:
            problems.append(f"{half[0]} reservations whose allocation rows do not match their gpu_count")
    return problems


# --- Orchestration -------------------------------------------------------------------------------------


def _web_command(port: int, workers: int, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The launcher's web process: its argv and its environment (the connection pool)."""
    from portal.launcher import services

    web = next(s for s in services(port, {**env, "HOST": "127.0.0.1"}) if s.name == "web")
    argv = [*web.argv, "--log-level", "warning"]
    if workers > 1:
        argv += ["--processes", str(workers)]  # portal.serve: a socket per process
    return argv, {**env, **web.env}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("seed", help="seed the database named by DATABASE_URL and print tokens as JSON")
    s.add_argument("--teams", type=int, default=8)
    s.add_argument("--users-per-team", type=int, default=4)
    s.add_argument("--nodes", type=int, default=8)
    s.add_argument("--gpus-per-node", type=int, default=8)
    s.add_argument("--staff", type=int, default=1)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds")
    parser.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="mean seconds a client waits between requests (exponential); 0: closed loop, each client sends its "
        "next request as soon as the last is answered (the saturation test)",
    )
    parser.add_argument("--workers", type=int, default=2, help="web processes (portal.serve --processes)")
    parser.add_argument("--teams", type=int, default=8)
    parser.add_argument("--users-per-team", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--horizon-days", type=int, default=30, help="bookings fall in the next N days")
    parser.add_argument("--mix", default="", help=f"e.g. me=10,book=20 (kinds: {','.join(DEFAULT_MIX)})")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LOAD_DATABASE_URL"),
        help="a PostgreSQL server (any database on it) to create the fresh database on; default: a private "
        "cluster started for the run (tests/support/private_services.py), so a shared server is never loaded",
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("LOAD_REDIS_URL"), help="default: a private redis-server for the run"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args(argv)

    if args.command == "seed":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        out = seed(
            teams=args.teams, users_per_team=args.users_per_team, nodes=args.nodes,
            gpus_per_node=args.gpus_per_node, staff=args.staff,
        )  # fmt: skip
        print(json.dumps(out))
        return 0

    import psycopg

    mix = dict(DEFAULT_MIX)
    for item in filter(None, args.mix.split(",")):
        kind, _, weight = item.partition("=")
        mix[kind.strip()] = int(weight)
    from tests.support.private_services import PrivatePostgres, PrivateRedis

    private_pg: PrivatePostgres | None = None
    private_redis: PrivateRedis | None = None
    if args.database_url is None:
        private_pg = PrivatePostgres(max_connections=300)
        private_pg.start()
        args.database_url = private_pg.url()
        print(f"private PostgreSQL on port {private_pg.port}")
    if args.redis_url is None:
        private_redis = PrivateRedis()
        private_redis.start()
        args.redis_url = private_redis.url()
        print(f"private redis-server on port {private_redis.port}")
    server = urllib.parse.urlsplit(args.database_url)
    dbname = f"portal_load_{os.getpid()}"
    db_url = urllib.parse.urlunsplit(server._replace(path=f"/{dbname}"))
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    var_dir = f"/tmp/portal-load-{os.getpid()}"
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": args.redis_url,
        "PORTAL_VAR_DIR": var_dir,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PYTHONUNBUFFERED": "1",
        "DEBUG": os.environ.get("DEBUG", "0"),  # as in production: no debug cursor, no query log
        # The point is to measure the service, not the abuse limits.
        "API_RATE_PER_TOKEN": "1000000/min",
        "API_RATE_PER_IP": "1000000/min",
    }
    web: subprocess.Popen[bytes] | None = None
    try:
        t0 = time.monotonic()
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
        seeded = run_seed(
            env, teams=args.teams, users_per_team=args.users_per_team, nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
        )  # fmt: skip
        print(
            f"database {dbname}: migrated and seeded in {time.monotonic() - t0:.1f}s "
            f"({len(seeded['users'])} users, {len(seeded['gpus'])} GPUs)"
        )
        port = free_port()
        web_argv, web_env = _web_command(port, args.workers, env)
        web = subprocess.Popen(web_argv, cwd=REPO, env=web_env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, web)
        pacing = f"think time {args.think:g}s (mean)" if args.think > 0 else "closed loop"
        print(f"web: {args.workers} process(es) at {url}; {args.clients} clients for {args.duration:.0f}s, {pacing}")
        stats, elapsed = asyncio.run(
            run_clients(
                url,
                seeded,
                clients=args.clients,
                duration=args.duration,
                mix=mix,
                horizon_days=args.horizon_days,
                think=args.think,
            )
        )
        summary = report(stats, elapsed)
        problems = audit(db_url, stats.booked)
        print("\naudit: " + ("OK (no overlaps, no duplicate ledger rows, every 201 booking complete)" if not problems
                              else "; ".join(problems)))  # fmt: skip
        return 1 if problems or summary["five_xx"] else 0
    finally:
        if web is not None and web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            try:
                web.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(web.pid, signal.SIGKILL)
                web.wait()
        if args.keep:
            print(f"kept database {db_url}")
        elif private_pg is None:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if private_pg is not None and not args.keep:
            private_pg.destroy()
        if private_redis is not None:
            private_redis.destroy()


if __name__ == "__main__":
    sys.exit(main())
