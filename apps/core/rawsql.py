"""Model instances from hand-written SQL, for the few lookups every API request makes.

Why: compiling an ORM query (filters, joins, ordering) costs more CPU than running it; for the token lookup and
the team lookup, which every booking and job submission makes, compilation was a third of the request's CPU. The
column lists come from the models' metadata, so a new field is picked up without touching the SQL, and values go
through the same database converters as the ORM's (JSON, decimals, time zones).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper


def _connection() -> BaseDatabaseWrapper:
    """This thread's connection itself. `django.db.connection` is a proxy that looks the connection up again on
    every attribute access, and the per-column loop below passes it to each field's converter."""
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


def fetch_one(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row


def fetch_all(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows
