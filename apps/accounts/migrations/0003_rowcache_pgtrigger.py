"""The row cache's NOTIFY triggers, declared on the models with django-pgtrigger (apps/accounts/triggers.py),
replace the ones migration 0002 wrote by hand: same channel, same payload (the table's name), same conditions."""

import importlib

import django.contrib.auth.models
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations


_HAND_MADE = importlib.import_module("apps.accounts.migrations.0002_rowcache_notify")


def _drop_hand_made(apps, schema_editor) -> None:
    for sql in _HAND_MADE._backward(apps):
        schema_editor.execute(sql)


def _restore_hand_made(apps, schema_editor) -> None:
    for sql in _HAND_MADE._forward(apps):
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_rowcache_notify'),
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.RunPython(_drop_hand_made, _restore_hand_made, elidable=False),
        migrations.CreateModel(
            name='UserRowCacheTriggers',
            fields=[
            ],
            options={
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('auth.user',),
            managers=[
                ('objects', django.contrib.auth.models.UserManager()),
            ],
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='apitoken',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_insdel', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='bc9ace5f114b95c603955ebae267324b9a30c1ca', operation='INSERT OR DELETE', pgid='pgtrigger_rowcache_insdel_b3e58', table='accounts_apitoken', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='apitoken',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_upd', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD."created_at" IS DISTINCT FROM (NEW."created_at") OR OLD."digest" IS DISTINCT FROM (NEW."digest") OR OLD."expires_at" IS DISTINCT FROM (NEW."expires_at") OR OLD."id" IS DISTINCT FROM (NEW."id") OR OLD."name" IS DISTINCT FROM (NEW."name") OR OLD."prefix" IS DISTINCT FROM (NEW."prefix") OR OLD."revoked_at" IS DISTINCT FROM (NEW."revoked_at") OR OLD."scopes" IS DISTINCT FROM (NEW."scopes") OR OLD."user_id" IS DISTINCT FROM (NEW."user_id"))', func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='42598616c41727b6b79a61899bdc2538c79dc519', operation='UPDATE', pgid='pgtrigger_rowcache_upd_cbfcb', table='accounts_apitoken', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='apitoken',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_trunc', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='f8a78f1c3acd7985c39b51c039db2f50cd921ef1', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_rowcache_trunc_f1b56', table='accounts_apitoken', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='membership',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_insdel', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='0fac8048a7b690ac0d275930b39b1e2e5a1f5ae8', operation='INSERT OR DELETE', pgid='pgtrigger_rowcache_insdel_45f1a', table='accounts_membership', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='membership',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_upd', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD.* IS DISTINCT FROM NEW.*)', func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='dfae9dbd499b82ac369d1782263867f0da3f7b3d', operation='UPDATE', pgid='pgtrigger_rowcache_upd_2cd98', table='accounts_membership', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='membership',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_trunc', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='ba6f24d2d77e1f261a2771ad1422ef7a77322447', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_rowcache_trunc_7fd7e', table='accounts_membership', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='team',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_insdel', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='e3c3f7621e1c598266d9c80199933d03f3b79fc1', operation='INSERT OR DELETE', pgid='pgtrigger_rowcache_insdel_46841', table='accounts_team', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='team',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_upd', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD.* IS DISTINCT FROM NEW.*)', func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='136ddab0665f497530c914f9f8a514db80e9d2e2', operation='UPDATE', pgid='pgtrigger_rowcache_upd_eeb9c', table='accounts_team', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='team',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_trunc', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='a0b4c16009ac9911cbdb4ba32ad5a0c0e6e7be0d', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_rowcache_trunc_be0e0', table='accounts_team', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='userrowcachetriggers',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_insdel', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='1665046a5dbdd42cb6ef87995ffe2445b39a65d8', operation='INSERT OR DELETE', pgid='pgtrigger_rowcache_insdel_75e4f', table='auth_user', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='userrowcachetriggers',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_upd', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD."date_joined" IS DISTINCT FROM (NEW."date_joined") OR OLD."email" IS DISTINCT FROM (NEW."email") OR OLD."first_name" IS DISTINCT FROM (NEW."first_name") OR OLD."id" IS DISTINCT FROM (NEW."id") OR OLD."is_active" IS DISTINCT FROM (NEW."is_active") OR OLD."is_staff" IS DISTINCT FROM (NEW."is_staff") OR OLD."is_superuser" IS DISTINCT FROM (NEW."is_superuser") OR OLD."last_name" IS DISTINCT FROM (NEW."last_name") OR OLD."password" IS DISTINCT FROM (NEW."password") OR OLD."username" IS DISTINCT FROM (NEW."username"))', func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='579912b97c8773b3e5f5c0907c600012a6435f75', operation='UPDATE', pgid='pgtrigger_rowcache_upd_f9ad3', table='auth_user', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='userrowcachetriggers',
            trigger=pgtrigger.compiler.Trigger(name='rowcache_trunc', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pg_notify('portal_rowcache', TG_TABLE_NAME); RETURN NULL;", hash='83160d46a3748822be3358be12862eca84816f3a', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_rowcache_trunc_f714b', table='auth_user', when='AFTER')),
        ),
    ]
