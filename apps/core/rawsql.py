"""Model instances from hand-written SQL, for the few lookups every API request makes.

Why: compiling an ORM query (filters, joins, ordering) costs more CPU than running it; for the token lookup and
the team lookup, which every booking and job submission makes, compilation was a third of the request's CPU. The
column lists come from the models' metadata, so a new field is picked up without touching the SQL, and values go
through the same database converters as the ORM's (JSON, decimals, time zones). Statements run on plain
`connection.cursor()` cursors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

M = TypeVar("M", bound=models.Model)


def _connection() -> BaseDatabaseWrapper:
    """This thread's connection itself. `django.db.connection` is a proxy that looks the connection up again on
    every attribute access; the per-column loops below pass it to each field's converter or get_db_prep_save
    (which read `connection.ops` and friends), and on a job submission those lookups cost ~50 per request."""
    return connections[DEFAULT_DB_ALIAS]


class Columns:
    """The concrete columns of `model` under a table alias: `sql` for a SELECT list, `load` for a row slice."""

    def __init__(self, model: type[models.Model], alias: str) -> None:
        self.model = model
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        quote = connection.ops.quote_name
        self.sql = ", ".join(f"{alias}.{quote(str(f.column))}" for f in self.fields)
        self.width = len(self.fields)
        self.pk_index = self.attnames.index(model._meta.pk.attname)  # None there: a LEFT JOIN found no row
        self._converters: list[list[Any]] | None = None

    def _field_converters(self) -> list[list[Any]]:
        # What the ORM's compiler applies to a selected column: the backend's converters, then the field's.
        if self._converters is None:
            out = []
            for field in self.fields:
                col = field.get_col(self.model._meta.db_table)
                out.append(connection.ops.get_db_converters(col) + field.get_db_converters(connection))
            self._converters = out
        return self._converters

    def load(self, row: Sequence[Any], offset: int = 0) -> Any:
        """An instance of the model from row[offset : offset + width], as if the ORM had loaded it."""
        values = list(row[offset : offset + self.width])
        conn = _connection()
        for i, converters in enumerate(self._field_converters()):
            if converters:
                field = self.fields[i]
                col = field.get_col(self.model._meta.db_table)
                for converter in converters:
                    values[i] = converter(values[i], col, conn)
        return self.model.from_db(conn.alias, self.attnames, values)


@cache
def columns(model: type[models.Model], alias: str) -> Columns:
    return Columns(model, alias)


class _KeptCursor:
    """The driver cursor kept on one database connection for statement_cursor(), and whether it is in use."""

    __slots__ = ("busy", "cursor")

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.busy = False


_KEPT = "_portal_kept_cursor"  # attribute on the driver's connection object (psycopg's Connection has a __dict__)


@contextmanager
def statement_cursor() -> Iterator[CursorWrapper]:
    """A cursor for hand-written statements whose results are read at once (execute, then fetch), like
    `connection.cursor()` but reusing one driver cursor per database connection.

    Why: opening a cursor through Django and closing it again costs more CPU than running a small prepared
    statement (~60-80 us against ~40 on this machine), and a booking runs three. Django's part (connection checks,
    error wrapping, the debug wrapper that records queries) is kept: only the driver cursor is reused, and with it
    psycopg's loaders for the result columns, which a new cursor looks up and builds again for every statement.

    The cursor lives as long as its connection (a pooled connection keeps it while other requests use the
    connection: one thread at a time). Not for results read lazily or for ORM code that may run another statement
    in between: a nested statement_cursor() gets a cursor of its own. Exceptions are Django's, as with
    connection.cursor().
    """
    wrapper = _connection()
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    raw = wrapper.connection
    kept: _KeptCursor | None = getattr(raw, _KEPT, None)
    if kept is None or kept.cursor.closed:
        with wrapper.wrap_database_errors:
            kept = _KeptCursor(wrapper.create_cursor())
        setattr(raw, _KEPT, kept)
    if kept.busy:  # nested: a cursor of its own, closed after
        with wrapper.cursor() as cursor:
            yield cursor
        return
    kept.busy = True
    try:
        # What Django's cursor() does with a new driver cursor (BaseDatabaseWrapper._prepare_cursor).
        wrapper.validate_thread_sharing()
        yield wrapper.make_debug_cursor(kept.cursor) if wrapper.queries_logged else wrapper.make_cursor(kept.cursor)
    finally:
        kept.busy = False


def fetch_one(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row


def execute(sql: str, params: Sequence[Any]) -> int:
    """Run a statement; returns how many rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def fetch_all(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


@cache
def field_converter(model: type[models.Model], name: str) -> Any:
    """A function turning a selected column of `model.name` into what the ORM would give (the backend's and the
    field's converters, as the ORM's compiler applies them); None when the value needs nothing."""
    field = model._meta.get_field(name)
    col = field.get_col(model._meta.db_table)  # type: ignore[union-attr]
    converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)  # type: ignore[union-attr]
    if not converters:
        return None

    def convert(value: Any) -> Any:
        conn = _connection()
        for converter in converters:
            value = converter(value, col, conn)
        return value

    return convert


def in_clause(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """`column` is one of `values`, as SQL and parameters: `= ANY(%s)` with one array parameter, the same
    statement text for any number of values, so psycopg prepares it once (an IN list of a new length is a new
    statement to parse and plan)."""
    return f"{column} = ANY(%s)", [list(values)]


def datetime_param(value: Any) -> Any:
    """TEMPORARY-INTEGRATION: PostgreSQL takes an aware datetime as it is; callers pass it directly, then this
    goes."""
    return value


# --- Writes ------------------------------------------------------------------------------------------------------
# For the writes every job makes (its row, its timeline, its quota hold) on the submission, start and end paths:
# building an INSERT or UPDATE through the ORM's compiler cost several times the CPU of running it. Values go
# through each field's get_db_prep_save, as the ORM's compilers do (JSON, decimals); no
# model signals are sent (none of these models has receivers). Expressions (F(), Now()) are not supported.


@cache
def _insert_sql(model: type[models.Model]) -> tuple[str, list[Any], bool]:
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    quote = connection.ops.quote_name
    returning = meta.auto_field is not None
    columns = ", ".join(quote(str(f.column)) for f in fields)
    sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES "  # noqa: S608 - names from the model's metadata
    return sql, fields, returning


def insert(objs: Sequence[M]) -> None:
    """INSERT `objs` (instances of one model, not saved yet) in one statement and set their primary keys."""
    if not objs:
        return
    model = type(objs[0])
    sql, fields, returning = _insert_sql(model)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params: list[Any] = []
    conn = _connection()
    for obj in objs:
        params.extend([f.get_db_prep_save(f.pre_save(obj, True), conn) for f in fields])
    pk = model._meta.pk
    assert pk is not None
    statement = sql + ", ".join([row] * len(objs))
    if returning:
        statement += f" RETURNING {conn.ops.quote_name(str(pk.column))}"
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        ids = [r[0] for r in cursor.fetchall()] if returning else []
    for obj, pk_value in zip(objs, ids, strict=False):
        obj.pk = pk_value
    for obj in objs:
        obj._state.adding = False
        obj._state.db = conn.alias


def update(model: type[models.Model], where: dict[str, Any], values: dict[str, Any]) -> int:
    """UPDATE `model` SET values WHERE every `where` field equals its value; returns the rows changed.

    Names are field names (a foreign key by its name with an instance or None, or by its attname with an id); a
    `where` value that is a list, tuple or set means "IN" (an empty one changes nothing)."""
    meta = model._meta
    conn = _connection()
    quote = conn.ops.quote_name

    def column_and_param(name: str, value: Any) -> tuple[str, Any]:
        field = meta.get_field(name)
        if isinstance(value, models.Model):
            value = value.pk
        return quote(str(field.column)), field.get_db_prep_save(value, conn)  # type: ignore[union-attr]

    sets, params = [], []
    for name, value in values.items():
        column, param = column_and_param(name, value)
        sets.append(f"{column} = %s")
        params.append(param)
    conditions = []
    for name, value in where.items():
        if isinstance(value, list | tuple | set | frozenset):  # field IN (...)
            if not value:
                return 0
            pairs = [column_and_param(name, v) for v in value]
            conditions.append(f"{pairs[0][0]} IN ({', '.join(['%s'] * len(pairs))})")
            params.extend(param for _, param in pairs)
            continue
        column, param = column_and_param(name, value)
        conditions.append(f"{column} = %s")
        params.append(param)
    # Table and column names from the model's metadata; every value is a parameter.
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}"  # noqa: S608
    return execute(sql, params)


def insert_with_child(parent: models.Model, child: models.Model, fk_attname: str) -> None:
    """INSERT `parent`, then `child` whose `fk_attname` points at it; set both primary keys and the foreign key.

    One statement (a data-modifying CTE: the child's foreign key is the parent's RETURNING id), so one round
    trip instead of two. Both instances are unsaved and of models with an auto primary key."""
    conn = _connection()
    parent_sql, parent_fields, _ = _insert_sql(type(parent))
    child_sql, child_fields, _ = _insert_sql(type(child))
    quote = conn.ops.quote_name
    parent_pk = type(parent)._meta.pk
    child_pk = type(child)._meta.pk
    assert parent_pk is not None and child_pk is not None
    params: list[Any] = [f.get_db_prep_save(f.pre_save(parent, True), conn) for f in parent_fields]
    values = []
    fk_column = ""
    for f in child_fields:
        if f.attname == fk_attname:
            fk_column = str(f.column)
            # Names from the models' metadata; every value is a parameter.
            values.append(f"(SELECT {quote(str(parent_pk.column))} FROM parent)")  # noqa: S608
        else:
            values.append("%s")
            params.append(f.get_db_prep_save(f.pre_save(child, True), conn))
    assert fk_column, f"{type(child).__name__} has no field {fk_attname!r}"
    statement = (
        f"WITH parent AS ({parent_sql}({', '.join(['%s'] * len(parent_fields))}) "
        f"RETURNING {quote(str(parent_pk.column))}) "
        f"{child_sql}({', '.join(values)}) RETURNING {quote(fk_column)}, {quote(str(child_pk.column))}"
    )
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    assert row is not None
    parent.pk, child.pk = row
    setattr(child, fk_attname, parent.pk)
    for obj in (parent, child):
        obj._state.adding = False
        obj._state.db = conn.alias
