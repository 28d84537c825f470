"""Billing test fixtures: a month of known activity (October 2026) and a clean live-broadcast state."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from apps.billing import services
from tests.billing import helpers

OCT = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_live_state() -> Iterator[None]:
    """Live broadcasts remember what they pushed in Redis, keyed by team id; ids repeat across tests."""
    from apps.core.redis import get_redis

    def clear() -> None:
        try:
            redis = get_redis()
            keys = list(redis.scan_iter("billing:*"))
            if keys:
                redis.delete(*keys)
        except Exception:  # tests without Redis do not use it
            pass

    clear()
    yield
    clear()


@pytest.fixture
def october(vision: Any, nlp: Any, alice: Any, bob: Any, charlie: Any) -> dict[str, Any]:
    """October 2026, closed into the ledger:
    - vision: bob books 2 A100 (2.50/h) for 10 h, one with telemetry at 50%, one without; alice runs a job on an
      L40S (1.10/h) for 3 h at 25%.
    - nlp: charlie runs a job on an A100 for 5 h at 100%.
    """
    a100 = helpers.gpu_model("A100-80GB", "2.5000")
    l40s = helpers.gpu_model("L40S", "1.1000")
    g1, g2, g3 = helpers.gpus(3, model=a100, node="oct-a")
    [g4] = helpers.gpus(1, model=l40s, node="oct-b")
    t0 = OCT + timedelta(days=4, hours=8)
    helpers.reserve(vision, bob, [g1, g2], t0, t0 + timedelta(hours=10))
    helpers.rollups(g1, t0, t0 + timedelta(hours=10), 50.0)
    job = helpers.run_job(vision, alice, g4, t0, t0 + timedelta(hours=3))
    helpers.rollups(g4, t0, t0 + timedelta(hours=3), 25.0)
    t1 = OCT + timedelta(days=20)
    charlie_job = helpers.run_job(nlp, charlie, g3, t1, t1 + timedelta(hours=5))
    helpers.rollups(g3, t1, t1 + timedelta(hours=5), 100.0)
    services.ledger_close(now=datetime(2026, 11, 5, tzinfo=UTC))
    return {"job": job, "charlie_job": charlie_job, "gpus": [g1, g2, g3, g4]}
