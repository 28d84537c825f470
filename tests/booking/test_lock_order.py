"""The booking write path takes the team's quota rows, then the GPUs' advisory locks, in one statement
(services.quotas.lock_usage): never a GPU lock before every quota row is held, and none while the month's first quota
row still has to be created. Real connections (threads) and pg_locks."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.booking import quota as quota_math
from apps.booking import selectors, services
from apps.booking.models import QuotaUsage
from apps.booking.services import quotas

pytestmark = pytest.mark.django_db(transaction=True)

GPUS = [70001, 70002, 70003]  # advisory lock keys only: no GPU rows needed


def _month() -> Any:
    return quota_math.month_of(timezone.now(), selectors.local_tz())


def _other_connection() -> psycopg.Connection[Any]:
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    return psycopg.connect(**params, autocommit=True)


def _gpu_locks_held(conn: psycopg.Connection[Any]) -> set[int]:
    rows = conn.execute(
        "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND granted AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
        [services.GPU_LOCK_NAMESPACE],
    ).fetchall()
    return {int(r[0]) for r in rows}


class Locker(threading.Thread):
    """lock_usage(team, [this month], GPUS) in its own connection; holds the transaction until released."""

    def __init__(self, team_id: int) -> None:
        super().__init__(daemon=True)
        self.team_id = team_id
        self.locked, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                quotas.lock_usage(self.team_id, [_month()], GPUS)
                self.locked.set()
                assert self.release.wait(30)
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc
            self.locked.set()
        finally:
            connection.close()


def test_gpu_locks_wait_for_the_quota_rows(vision: Any) -> None:
    QuotaUsage.objects.create(team=vision, month=_month(), slot=0)
    with _other_connection() as holder, _other_connection() as observer:
        holder.autocommit = False
        holder.execute("SELECT 1 FROM booking_quotausage WHERE team_id = %s FOR UPDATE", [vision.pk])
        locker = Locker(vision.pk)
        locker.start()
        try:
            assert not locker.locked.wait(1.0)  # queued behind the quota row
            assert _gpu_locks_held(observer) == set()  # ... holding no GPU meanwhile
        finally:
            holder.rollback()
        assert locker.locked.wait(30) and locker.error is None
        assert _gpu_locks_held(observer) == set(GPUS)
        locker.release.set()
        locker.join(30)
        assert _gpu_locks_held(observer) == set()


def test_a_month_without_quota_rows_is_created_then_locked_with_the_gpus(vision: Any) -> None:
    assert not QuotaUsage.objects.filter(team=vision).exists()
    with _other_connection() as observer:
        locker = Locker(vision.pk)
        locker.start()
        assert locker.locked.wait(30) and locker.error is None
        assert _gpu_locks_held(observer) == set(GPUS)
        locker.release.set()
        locker.join(30)
    assert QuotaUsage.objects.filter(team=vision, month=_month(), slot=0).exists()
