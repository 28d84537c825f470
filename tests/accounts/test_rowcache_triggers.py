"""The row cache's NOTIFY triggers (apps/accounts/triggers.py): the database holds exactly the ones the models
declare, and each fires on what the cache depends on (behaviour end to end: tests/core/test_rowcache.py)."""

from __future__ import annotations

import pytest
from django.db import connection, models

from apps.accounts.models import ApiToken, Membership, Team, UserRowCacheTriggers
from apps.core.rowcache import CHANNEL

pytestmark = pytest.mark.django_db

CACHED: tuple[type[models.Model], ...] = (ApiToken, Membership, Team, UserRowCacheTriggers)


def _installed(tables: set[str]) -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE NOT t.tgisinternal AND c.relname = ANY(%s)",
            [sorted(tables)],
        )
        return set(cursor.fetchall())


def test_the_cached_tables_hold_exactly_the_declared_triggers() -> None:
    declared = {(model._meta.db_table, trigger.get_pgid(model)) for model in CACHED for trigger in model._meta.triggers}
    assert len(declared) == 3 * len(CACHED)  # insert/delete, update, truncate on each
    assert _installed({table for table, _ in declared}) == declared  # the hand-made ones are gone


def test_every_trigger_notifies_the_row_cache_channel_with_the_table() -> None:
    for model in CACHED:
        for trigger in model._meta.triggers:
            assert f"pg_notify('{CHANNEL}', TG_TABLE_NAME)" in trigger.render_func(model)


@pytest.mark.parametrize(("model", "bookkeeping"), [(ApiToken, "last_used_at"), (UserRowCacheTriggers, "last_login")])
def test_a_bookkeeping_column_alone_fires_no_update_trigger(model: type[models.Model], bookkeeping: str) -> None:
    (update,) = (t for t in model._meta.triggers if t.name == "rowcache_upd")
    condition = update.render_condition(model)
    assert f'"{bookkeeping}"' not in condition
    columns = {f.column for f in model._meta.concrete_fields} - {bookkeeping}
    assert all(f'OLD."{column}"' in condition for column in columns)
