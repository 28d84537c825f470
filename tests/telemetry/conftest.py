from __future__ import annotations

from collections.abc import Iterator

import pytest

from apps.fleet import auth
from tests.fleet.procs import clean_fleet_redis


@pytest.fixture(autouse=True)
def _fresh_fleet_state() -> Iterator[None]:
    """Each test starts with no live telemetry, no queued messages and an empty node cache."""
    clean_fleet_redis()
    auth.forget()
    yield
    auth.forget()
