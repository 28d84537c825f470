"""Two closers at once: each piece is billed once, whether the lock serializes them or not."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from apps.billing import services
from apps.billing.models import UsageRecord
from tests.billing import helpers

pytestmark = [pytest.mark.django_db(transaction=True)]

NOW = datetime(2026, 10, 20, tzinfo=UTC)


def _in_threads(count: int, work: Callable[[], Any]) -> list[Any]:
    """Run `work` in `count` threads released together; each thread has its own connection."""
    barrier = threading.Barrier(count)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def _activity(vision: Any, bob: Any) -> int:
    gpu_list = helpers.gpus(4)
    start = datetime(2026, 10, 1, 6, tzinfo=UTC)
    helpers.reserve(vision, bob, gpu_list[:2], start, start + timedelta(days=3, hours=5))
    for i, gpu in enumerate(gpu_list[2:]):
        helpers.run_job(vision, bob, gpu, start + timedelta(hours=i), start + timedelta(days=1, hours=2 * i))
    return 2 * 4 + 2 + 2  # reservation: 2 GPUs x 4 days; jobs: 2 days each


def test_concurrent_closers_bill_each_piece_once(vision, bob):
    expected = _activity(vision, bob)
    written = _in_threads(4, lambda: services.ledger_close(now=NOW))
    assert sorted(written) == [0, 0, 0, expected]  # the lock queues them; the first writes everything
    assert UsageRecord.objects.count() == expected


def test_concurrent_inserts_without_the_lock_still_write_each_row_once(vision, bob):
    """The guarantee is the unique key, not the advisory lock: inserts that race past every Python check (here:
    rows computed up front, inserted at once from four connections) leave one row per piece."""
    expected = _activity(vision, bob)
    rows = services.ledger_rows_due(now=NOW)
    assert len(rows) == expected

    def insert() -> int:
        copies = [UsageRecord(**{f.attname: getattr(r, f.attname) for f in r._meta.concrete_fields}) for r in rows]
        with transaction.atomic():
            services.ledger_insert(copies)
        return len(copies)

    _in_threads(4, insert)
    assert UsageRecord.objects.count() == expected
