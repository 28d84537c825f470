"""INSERT statements built from the models' metadata, for the writes that run as part of a larger statement.

Every concrete column of the model is written, from the instance as the ORM would save it (`pre_save`, then
`get_db_prep_save`): a column added to a model is written without touching the SQL, and a value's Python
defaults (`auto_now_add`, `default=`) apply. The rows are a `SELECT` (a `VALUES` list the caller may guard with a
`WHERE`), where PostgreSQL does not infer types from the target table: the first row casts each value to its
column's type, the others take the types of the first."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models


class Params:
    """The named parameters of one statement. A value given again with the same type and cast is sent once: the
    rows of one write repeat most values (team, times, ids), and psycopg keeps the parsed form of a statement only
    when it has few parameters (`psycopg._queries.MAX_CACHED_STATEMENT_PARAMS`), which a booking's statement then
    stays under (tests/booking/test_booking_write.py checks it)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._names: dict[tuple[str, type, Any], str] = {}

    def name(self, value: Any, cast: str = "") -> str:
        """The name `value` is sent under (a new one unless an equal value of its type and cast was given)."""
        key = (cast, type(value), value)
        try:
            found = self._names.get(key)
        except TypeError:  # an unhashable value (a list, a JSON adapter): sent as it is, every time
            return self._add(value)
        if found is None:
            found = self._names[key] = self._add(value)
        return found

    def _add(self, value: Any) -> str:
        name = f"p{len(self.values)}"
        self.values[name] = value
        return name

    def __call__(self, value: Any, cast: str = "") -> str:
        """A placeholder for `value`, cast to `cast` when given."""
        placeholder = f"%({self.name(value, cast)})s"
        return f"{placeholder}::{cast}" if cast else placeholder


def _cast(field: models.Field[Any, Any]) -> str:
    # The base type without a length or precision: a cast to varchar(16) would cut a longer value silently, where
    # the assignment to the column refuses it as the ORM's INSERT does.
    name = re.sub(r"\(.*\)", "", str(field.cast_db_type(connection)))
    return {"timestamp with time zone": "timestamptz"}.get(name, name)


@cache
def _statement(model: type[models.Model], with_pk: bool) -> tuple[list[models.Field[Any, Any]], list[str], str]:
    """The fields written, their casts and the INSERT's head: the same for every row of a model, so built once per
    process (hot paths write these rows on every booking)."""
    fields = [f for f in model._meta.concrete_fields if with_pk or not f.primary_key]
    quote = connection.ops.quote_name
    # Table and column names from the model's metadata; every value is a parameter.
    head = f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(str(f.column)) for f in fields)})"
    return fields, [_cast(f) for f in fields], head


def written_fields(obj: models.Model) -> list[models.Field[Any, Any]]:
    """The columns an INSERT of `obj` writes: every concrete field, the primary key only when it is set."""
    return _statement(type(obj), obj.pk is not None)[0]


def insert_rows(objs: Sequence[models.Model], params: Params, *, guard: str = "", suffix: str = "") -> str:
    """`INSERT INTO <table> (<every column>) SELECT * FROM (VALUES <one row per obj>) [guard] [suffix]`, its values
    added to `params`. `objs`: unsaved instances of one model, all with or all without a primary key. `guard`: a
    `WHERE` clause that may keep every row out; `suffix`: e.g. `ON CONFLICT ...` or `RETURNING ...` (caller's SQL)."""
    assert objs, "nothing to insert"
    fields, casts, head = _statement(type(objs[0]), objs[0].pk is not None)
    # The connection itself, not the `django.db.connection` proxy, which looks it up again on every attribute
    # access: each field's conversion reads it a few times, for every column of every row.
    conn = connections[DEFAULT_DB_ALIAS]
    name = params.name
    rows = []
    for n, obj in enumerate(objs):
        values = [(f.get_db_prep_save(f.pre_save(obj, True), conn), c) for f, c in zip(fields, casts, strict=True)]
        if n == 0:
            rows.append(", ".join(f"%({name(value, cast)})s::{cast}" for value, cast in values))
        else:  # typed by the first row; named by type and cast all the same, so equal values are sent once
            rows.append(", ".join(f"%({name(value, cast)})s" for value, cast in values))
    sql = f"{head} SELECT * FROM (VALUES ({'), ('.join(rows)})) AS v {guard} {suffix}"  # noqa: S608
    return sql.strip()
