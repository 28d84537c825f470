"""INSERT statements built from the models' metadata, for the writes that run as part of a larger statement.

Every concrete column of the model is written, from the instance as the ORM would save it (`pre_save`, then
`get_db_prep_save`): a column added to a model is written without touching the SQL, and a value's Python
defaults (`auto_now_add`, `default=`) apply. Each value is cast to its column's type, because the rows are a
`SELECT` (a `VALUES` list the caller may guard with a `WHERE`), where PostgreSQL does not infer types from the
target table."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models


def _cast(field: models.Field[Any, Any]) -> str:
    # The base type without a length or precision: a cast to varchar(16) would cut a longer value silently, where
    # the assignment to the column refuses it as the ORM's INSERT does.
    return re.sub(r"\(.*\)", "", str(field.cast_db_type(connection)))


def written_fields(obj: models.Model) -> list[models.Field[Any, Any]]:
    """The columns an INSERT of `obj` writes: every concrete field, the primary key only when it is set."""
    return _statement(type(obj), obj.pk is not None)[0]


@cache
def _statement(model: type[models.Model], with_pk: bool) -> tuple[list[models.Field[Any, Any]], str, str]:
    """The fields written, the INSERT's head and one row of placeholders: the same for every row of a model, so
    built once per process (hot paths write these rows on every booking)."""
    fields = [f for f in model._meta.concrete_fields if with_pk or not f.primary_key]
    quote = connection.ops.quote_name
    # Table and column names from the model's metadata; every value is a parameter.
    head = f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(str(f.column)) for f in fields)})"
    row = "(" + ", ".join(f"%s::{_cast(f)}" for f in fields) + ")"
    return fields, head, row


def insert_rows(objs: Sequence[models.Model], *, guard: str = "", suffix: str = "") -> tuple[str, list[Any]]:
    """`INSERT INTO <table> (<every column>) SELECT ... FROM (VALUES <one row per obj>) [guard] [suffix]` and its
    parameters. `objs`: unsaved instances of one model, all with or all without a primary key. `guard`: a `WHERE`
    clause that may keep every row out; `suffix`: e.g. `ON CONFLICT ...` or `RETURNING ...` (caller's SQL)."""
    assert objs, "nothing to insert"
    fields, head, row = _statement(type(objs[0]), objs[0].pk is not None)
    # The connection itself, not the `django.db.connection` proxy, which looks it up again on every attribute
    # access: each field's conversion reads it a few times, for every column of every row.
    conn = connections[DEFAULT_DB_ALIAS]
    params = [f.get_db_prep_save(f.pre_save(obj, True), conn) for obj in objs for f in fields]
    sql = f"{head} SELECT * FROM (VALUES {', '.join([row] * len(objs))}) AS v {guard} {suffix}"  # noqa: S608
    return sql.strip(), params
