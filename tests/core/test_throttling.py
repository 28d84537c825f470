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


# --- The API's default: the token's and the address's limits in one call -----------------------------------------


def _api_throttle(token_rate: str, ip_rate: str) -> throttling.ApiRateThrottle:
    class Token(throttling.TokenRateThrottle):
        pass

    class Ip(throttling.IpRateThrottle):
        pass

    Token.rate, Ip.rate = token_rate, ip_rate

    class Combined(throttling.ApiRateThrottle):
        parts = (Token, Ip)

    return Combined()


class _Token:
    def __init__(self, pk: int) -> None:
        self.pk = pk


def _token_request(token_pk: int, address: str = "203.0.113.7") -> Request:
    request = _request(address)
    request._authenticator = None
    request._user, request._auth = object(), _Token(token_pk)
    return request


def test_combined_limits_judge_each_like_drf_lists_of_throttles() -> None:
    view = APIView()
    # Token 1 may make 2 requests a minute, the address 3.
    assert [_api_throttle("2/min", "3/min").allow_request(_token_request(1), view) for _ in range(2)] == [True] * 2
    refused = _api_throttle("2/min", "3/min")
    assert refused.allow_request(_token_request(1), view) is False  # the token's limit
    wait = refused.wait()
    assert wait is not None and 58 <= wait <= 60
    # The address allowed (and so counted) the third request although the token refused it, as DRF does when it
    # asks every throttle: token 2 from the same address finds the address's allowance used up.
    assert _api_throttle("2/min", "3/min").allow_request(_token_request(2), view) is False
    # ... while token 2's limit allowed and counted that request although the address refused it: elsewhere token 2
    # has one request left, and the new address counts every request, the ones token 2's limit refuses included.
    other = "203.0.113.9"
    statuses = [_api_throttle("2/min", "3/min").allow_request(_token_request(2, other), view) for _ in range(3)]
    assert statuses == [True, False, False]
    logs = {key.decode().rsplit("_", 1)[-1]: get_redis().zcard(key) for key in get_redis().keys("portal:throttle_*")}
    assert logs == {"t1": 2, "t2": 2, "203.0.113.7": 3, "203.0.113.9": 3}, logs


def test_combined_limits_wait_for_the_longest_refusal() -> None:
    view = APIView()
    assert _api_throttle("1/s", "1/min").allow_request(_token_request(3), view) is True
    both = _api_throttle("1/s", "1/min")
    assert both.allow_request(_token_request(3), view) is False
    wait = both.wait()
    assert wait is not None and 58 <= wait <= 60  # the address's minute, not the token's second


def test_combined_limits_are_one_round_trip(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = throttling._script()

    def counting(*, keys: list[str], args: list[Any]) -> Any:
        calls.append(len(keys))
        return real(keys=keys, args=args)

    monkeypatch.setattr(throttling, "_script", lambda: counting)
    assert _api_throttle("5/min", "5/min").allow_request(_token_request(4), APIView()) is True
    assert calls == [2]
    # Anonymous: only the address's limit applies.
    assert _api_throttle("5/min", "5/min").allow_request(_request("203.0.113.10"), APIView()) is True
    assert calls == [2, 1]


def test_exempt_views_are_not_counted() -> None:
    class Health(APIView):
        throttle_exempt = True

    assert all(_api_throttle("1/min", "1/min").allow_request(_token_request(5), Health()) for _ in range(5))
    assert get_redis().keys("portal:throttle_*") == []
