"""rawsql.statement_cursor: one driver cursor reused per PostgreSQL connection, with everything Django's own
cursor gives (its exceptions, query logging, reconnects); a nested use gets a cursor of its own."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.core.rawsql import _KEPT, statement_cursor
from tests.conftest import requires_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def _driver(cursor: object) -> object:
    return cursor.cursor  # type: ignore[attr-defined]  # Django's CursorWrapper around the driver's cursor


@requires_postgres
def test_the_driver_cursor_is_kept_per_connection() -> None:
    with statement_cursor() as one:
        one.execute("SELECT 1")
        assert one.fetchone() == (1,)
    with statement_cursor() as two:
        two.execute("SELECT %s::int + 1", [1])
        assert two.fetchone() == (2,)
    assert _driver(one) is _driver(two) and not _driver(two).closed
    assert getattr(connection.connection, _KEPT).cursor is _driver(two)


@requires_postgres
def test_nested_use_gets_its_own_cursor_and_results_stay_apart() -> None:
    with statement_cursor() as outer:
        outer.execute("SELECT generate_series(1, 3)")
        with statement_cursor() as inner:
            assert _driver(inner) is not _driver(outer)
            inner.execute("SELECT 'inner'")
            assert inner.fetchone() == ("inner",)
        assert outer.fetchall() == [(1,), (2,), (3,)]
    assert _driver(inner).closed and not _driver(outer).closed


@requires_postgres
def test_errors_are_djangos_and_the_cursor_works_after_them() -> None:
    with pytest.raises(DatabaseError), statement_cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    with pytest.raises(IntegrityError), transaction.atomic(), statement_cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE t_once (x int PRIMARY KEY)")
        cursor.execute("INSERT INTO t_once VALUES (1), (1)")
    with statement_cursor() as again:
        again.execute("SELECT 42")
        assert again.fetchone() == (42,)
    assert _driver(again) is _driver(cursor)


@requires_postgres
def test_queries_are_logged_and_a_new_connection_gets_a_new_cursor() -> None:
    with CaptureQueriesContext(connection) as captured, statement_cursor() as cursor:
        cursor.execute("SELECT %s::text", ["logged"])
    assert any("logged" in q["sql"] for q in captured.captured_queries)
    first = _driver(cursor)
    connection.close()
    with statement_cursor() as cursor:
        cursor.execute("SELECT 7")
        assert cursor.fetchone() == (7,)
    assert _driver(cursor) is not first


def test_sqlite_and_postgres_answer_alike() -> None:
    with statement_cursor() as cursor:
        cursor.execute("SELECT 1 + 1")
        assert cursor.fetchone() == (2,)
