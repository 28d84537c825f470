"""Tell every web process when a row it may have cached changed (apps/core/rowcache.py).

Triggers on the tables behind the per-request lookups (a token with its user, a team with the caller's
membership) send `NOTIFY portal_rowcache, '<table>'`, which PostgreSQL delivers when the transaction commits and
never when it rolls back. Triggers, not Django signals: they also see `QuerySet.update()`, bulk deletes, the
admin's cascades, TRUNCATE (the test runner's flush) and an administrator's SQL. The per-use bookkeeping columns
(`last_used_at` of a token, `last_login` of a user) do not fire them: nothing cached depends on them, and a token in
use writes its `last_used_at` once a minute.

Migration 0003 replaces these triggers with the ones the models declare through django-pgtrigger.
"""

from django.conf import settings
from django.db import migrations

CHANNEL = "portal_rowcache"
FUNCTION = "portal_rowcache_notify"

# (model, the column that changes on every use and nothing cached depends on, or None)
MODELS = [
    ("accounts.ApiToken", "last_used_at"),
    (settings.AUTH_USER_MODEL, "last_login"),
    ("accounts.Team", None),
    ("accounts.Membership", None),
]


def _tables(apps) -> list[tuple[str, str | None]]:
    return [(apps.get_model(label)._meta.db_table, bookkeeping) for label, bookkeeping in MODELS]


def _forward(apps) -> list[str]:
    out = [
        f"""CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME);
            RETURN NULL;
        END $$"""
    ]
    for table, bookkeeping in _tables(apps):
        out.append(
            f"CREATE TRIGGER {table}_rowcache_insdel AFTER INSERT OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )
        changed = "OLD.* IS DISTINCT FROM NEW.*"
        if bookkeeping:
            changed = f"(to_jsonb(OLD) - '{bookkeeping}') IS DISTINCT FROM (to_jsonb(NEW) - '{bookkeeping}')"
        out.append(
            f"CREATE TRIGGER {table}_rowcache_upd AFTER UPDATE ON {table} "
            f"FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION {FUNCTION}()"
        )
        out.append(
            f"CREATE TRIGGER {table}_rowcache_trunc AFTER TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
        )
    return out


def _backward(apps) -> list[str]:
    out = []
    for table, _ in _tables(apps):
        for suffix in ("insdel", "upd", "trunc"):
            out.append(f"DROP TRIGGER IF EXISTS {table}_rowcache_{suffix} ON {table}")
    out.append(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    return out


def _run(statements):
    def run(apps, schema_editor) -> None:
        for sql in statements(apps):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(_run(_forward), _run(_backward), elidable=False)]
