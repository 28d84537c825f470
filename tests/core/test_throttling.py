"""The rate limiter against the real Redis: DRF's sliding-log semantics in one Lua call per throttle."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from apps.core.api import throttling
from apps.core.redis import get_redis


def _throttle(rate: str) -> throttling.IpRateThrottle:
    class Limited(throttling.IpRateThrottle):
        pass

    Limited.rate = rate
    return Limited()


def _request(address: str = "203.0.113.7") -> Request:
    return Request(APIRequestFactory().get("/api/v1/me", REMOTE_ADDR=address))


@pytest.fixture(autouse=True)
def _reset() -> None:
    get_redis().flushdb()
    throttling._cache_down_until = 0.0


def test_allows_the_rate_then_refuses_with_the_time_until_a_slot_frees() -> None:
    view, request = APIView(), _request()
    began = time.time()
    assert [_throttle("5/min").allow_request(request, view) for _ in range(5)] == [True] * 5
    refused = _throttle("5/min")
    assert refused.allow_request(request, view) is False
    wait = refused.wait()
    assert wait is not None and 60 - (time.time() - began) - 1 <= wait <= 60
    # Another address has its own allowance.
    assert _throttle("5/min").allow_request(_request("203.0.113.8"), view) is True


def test_refused_requests_are_not_counted_and_the_window_slides() -> None:
    view, request = APIView(), _request()
    assert all(_throttle("3/s").allow_request(request, view) for _ in range(3))
    for _ in range(20):  # hammering while refused does not extend the refusal
        assert _throttle("3/s").allow_request(request, view) is False
    probe = _throttle("3/s")
    probe.allow_request(request, view)
    assert probe.wait() is not None and 0 <= probe.wait() <= 1.0
    time.sleep(probe.wait() + 0.05)
    assert _throttle("3/s").allow_request(request, view) is True


def test_the_stored_log_stays_bounded_by_the_rate() -> None:
    view, request = APIView(), _request()
    for _ in range(40):
        _throttle("10/min").allow_request(request, view)
    keys = get_redis().keys("portal:throttle_ip_*")
    assert len(keys) == 1
    assert get_redis().zcard(keys[0]) == 10
    assert 0 < get_redis().pttl(keys[0]) <= 60_000  # the key expires with the window


def test_parallel_requests_never_exceed_the_rate() -> None:
    view = APIView()
    results: list[bool] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(10):
            allowed = _throttle("25/min").allow_request(_request(), view)
            with lock:
                results.append(allowed)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80 and results.count(True) == 25


def test_a_restarted_redis_without_the_script_is_handled() -> None:
    view, request = APIView(), _request()
    assert _throttle("2/min").allow_request(request, view) is True
    get_redis().script_flush()  # what a Redis restart does to the script cache: EVALSHA answers NOSCRIPT
    assert _throttle("2/min").allow_request(request, view) is True
    assert _throttle("2/min").allow_request(request, view) is False
    assert throttling._cache_down_until == 0.0  # reloaded, not failed open


def test_fails_open_when_redis_is_unreachable(monkeypatch: Any) -> None:
    import redis

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(throttling, "_script", lambda: dead.register_script(throttling._SLIDING_LOG))
    view, request = APIView(), _request()
    assert all(_throttle("1/min").allow_request(request, view) for _ in range(3))
    assert throttling._cache_down_until > time.monotonic()
