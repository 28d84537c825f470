"""apps.core.rawsql: instances loaded from hand-written SQL equal what the ORM loads, column for column."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from apps.core import rawsql
from apps.jobs.models import Job

pytestmark = pytest.mark.django_db


def _job(team: Any, user: Any) -> Job:
    return Job.objects.create(
        team=team,
        user=user,
        image="local/test",
        command=["python", "-c", "print('ü')"],
        env={"A": "1", "QUOTE": 'it\'s "x"'},
        mounts=[{"source": "/data", "target": "/data", "read_only": True}],
        gpu_count=2,
        gpu_models=["A100-80GB", "H100-80GB"],
        cpus=Decimal("1.50"),
        memory_mib=2048,
        max_duration_s=600,
    )


def _fields(obj: Job) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in Job._meta.concrete_fields}


def test_columns_cover_every_concrete_field_and_load_what_the_orm_loads(alice: Any, vision: Any) -> None:
    job = _job(vision, alice)
    cols = rawsql.columns(Job, "j")
    assert cols.attnames == [f.attname for f in Job._meta.concrete_fields]
    table = connection.ops.quote_name(Job._meta.db_table)
    row = rawsql.fetch_one(f"SELECT {cols.sql} FROM {table} j WHERE j.id = %s", [job.pk])  # noqa: S608
    assert row is not None

    loaded = cols.load(row)

    assert _fields(loaded) == _fields(Job.objects.get(pk=job.pk))
    assert not loaded._state.adding and loaded._state.db == "default"


def test_a_row_slice_at_an_offset_loads_the_joined_model(alice: Any, vision: Any) -> None:
    job = _job(vision, alice)
    cols = rawsql.columns(Job, "j")
    table = connection.ops.quote_name(Job._meta.db_table)
    rows = rawsql.fetch_all(f"SELECT 7, {cols.sql} FROM {table} j WHERE j.id = %s", [job.pk])  # noqa: S608
    assert len(rows) == 1 and rows[0][0] == 7
    assert cols.load(rows[0], offset=1).pk == job.pk
    assert rawsql.fetch_one(f"SELECT 1 FROM {table} WHERE id = %s", [-1]) is None  # noqa: S608
