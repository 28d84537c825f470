"""The NOTIFY triggers behind the web process's row cache (apps/core/rowcache.py).

Every change to a row the cache may hold sends `NOTIFY portal_rowcache, '<table>'`, which PostgreSQL delivers when
the changing transaction commits and never when it rolls back. Triggers, not Django signals: they also see
`QuerySet.update()`, bulk deletes, the admin's cascades, TRUNCATE (the test runner's flush) and an administrator's
SQL. A column written on every use that nothing cached depends on (`last_used_at` of a token, `last_login` of a
user) is left out of the update trigger's condition, so those writes notify nobody.
"""

from __future__ import annotations

import pgtrigger

from apps.core.rowcache import CHANNEL

# Returns NULL: an AFTER trigger's result is ignored.
_NOTIFY = f"PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME); RETURN NULL;"


def rowcache_triggers(*, bookkeeping: str | None = None) -> list[pgtrigger.Trigger]:
    """The three triggers of one cached table: rows inserted or deleted, rows changed (except in `bookkeeping`),
    the table truncated."""
    changed = pgtrigger.AnyChange(exclude=[bookkeeping]) if bookkeeping else pgtrigger.AnyChange()
    return [
        pgtrigger.Trigger(
            name="rowcache_insdel", when=pgtrigger.After, operation=pgtrigger.Insert | pgtrigger.Delete, func=_NOTIFY
        ),
        pgtrigger.Trigger(
            name="rowcache_upd", when=pgtrigger.After, operation=pgtrigger.Update, condition=changed, func=_NOTIFY
        ),
        pgtrigger.Trigger(
            name="rowcache_trunc",
            when=pgtrigger.After,
            operation=pgtrigger.Truncate,
            level=pgtrigger.Statement,
            func=_NOTIFY,
        ),
    ]
