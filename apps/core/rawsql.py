"""Model instances from hand-written SQL, for the few lookups every API request makes.

Why: compiling an ORM query (filters, joins, ordering) costs more CPU than running it; for the token lookup and
the team lookup, which every booking and job submission makes, compilation was a third of the request's CPU. The
column lists come from the models' metadata, so a new field is picked up without touching the SQL, and values go
through the same database converters as the ORM's (JSON, decimals, time zones).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)


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
        for i, converters in enumerate(self._field_converters()):
            if converters:
                field = self.fields[i]
                col = field.get_col(self.model._meta.db_table)
                for converter in converters:
                    values[i] = converter(values[i], col, connection)
        return self.model.from_db(connection.alias, self.attnames, values)


@cache
def columns(model: type[models.Model], alias: str) -> Columns:
    return Columns(model, alias)


def fetch_one(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def execute(sql: str, params: Sequence[Any]) -> int:
    """Run a statement; returns how many rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def fetch_all(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@cache
def field_converter(model: type[models.Model], name: str) -> Any:
    """A function turning a selected column of `model.name` into what the ORM would give (e.g. SQLite's text
    datetimes into aware datetimes); None when the value needs nothing."""
    field = model._meta.get_field(name)
    col = field.get_col(model._meta.db_table)  # type: ignore[union-attr]
    converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)  # type: ignore[union-attr]
    if not converters:
        return None

    def convert(value: Any) -> Any:
        for converter in converters:
            value = converter(value, col, connection)
        return value

    return convert


def datetime_param(value: Any) -> Any:
    """A datetime as a query parameter, stored the way the ORM stores it (SQLite compares text)."""
    return connection.ops.adapt_datetimefield_value(value)
