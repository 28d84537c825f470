"""Rate limits per token (or session user) and per client IP; 429 carries Retry-After.

DRF's SimpleRateThrottle keeps each client's request times as a pickled list in the cache and reads and writes
the whole list on every request: two round trips per throttle, and a payload that grows with the rate. All load
clients behind one address share the IP's list (1,800 entries at 30 requests/s), so every request pickled,
shipped and unpickled ~16 KB twice, and throttling was a quarter of the web process's time under load
(py-spy, bench/load_test.py). Here the same sliding log lives in a Redis sorted set, trimmed, counted and
appended by one Lua script: one round trip per throttle, O(log n) work in Redis, a few bytes over the wire.
The semantics stay DRF's: N requests in any window of the rate's length, refused requests are not counted, and
Retry-After is the time until the oldest counted request leaves the window.

The API's default throttle, `ApiRateThrottle`, checks the token's and the address's limits in one call of the
script (one round trip per request instead of one per limit: the second EVALSHA was ~5% of a booking request's
CPU in the web process); `TokenRateThrottle` and `IpRateThrottle` remain for views and code that want one limit.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

if TYPE_CHECKING:
    import redis
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


# After a cache failure, skip rate limiting in this process for this long: a Redis that hangs (rather than refusing
# connections) would otherwise cost every request the client's socket timeout, twice (token and address).
CACHE_RETRY_AFTER_S = 5.0
_cache_down_until = 0.0

# KEYS: one sorted set per limit (score = request time in ms). ARGV: now_ms, member, then window_ms and limit for
# each key in order. Each limit is judged as DRF judges its throttles one after another: a limit that is reached
# refuses and does not record the request; the others record it. Returns, per key, -1 when allowed (and recorded),
# else the milliseconds until a slot frees.
_SLIDING_LOG = """
local now = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[2 * i + 1])
  local limit = tonumber(ARGV[2 * i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count >= limit then
    local oldest = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
    local wait = window
    if oldest[2] then wait = tonumber(oldest[2]) + window - now end
    if wait < 0 then wait = 0 end
    out[i] = wait
  else
    redis.call('ZADD', key, now, ARGV[2])
    redis.call('PEXPIRE', key, window)
    out[i] = -1
  end
end
return out
"""


@functools.cache
def _client() -> redis.Redis:
    """A client with the cache's 2 s timeouts and no retries: a hung Redis costs one request 2 s, then the
    throttles stand aside for CACHE_RETRY_AFTER_S (fail open)."""
    import redis
    from django.conf import settings
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        settings.REDIS.redis_py_url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0)
    )


@functools.cache
def _script() -> Any:
    # register_script sends EVALSHA and loads the script again when Redis answers NOSCRIPT (after a restart).
    return _client().register_script(_SLIDING_LOG)


def _check(limits: list[tuple[str, int, int]]) -> float | None:
    """Record one request against each (key, window_s, limit) in one round trip. None when every limit allows it
    (or the cache is unavailable: fail open), else the seconds until the longest-refusing limit frees a slot."""
    global _cache_down_until
    if not limits or time.monotonic() < _cache_down_until:
        return None
    now_ms = int(time.time() * 1000)
    member = f"{now_ms}:{os.urandom(6).hex()}"  # unique: two requests in the same millisecond both count
    args: list[Any] = [now_ms, member]
    for _, window_s, limit in limits:
        args += [int(window_s) * 1000, int(limit)]
    try:
        waits = _script()(keys=[f"portal:{key}" for key, _, _ in limits], args=args)
    except Exception as exc:  # redis.ConnectionError, TimeoutError and friends
        _cache_down_until = time.monotonic() + CACHE_RETRY_AFTER_S
        logger.warning("rate limiting skipped, cache unavailable: %s", exc.__class__.__name__)
        return None
    refused = [int(wait) for wait in waits if int(wait) >= 0]
    return max(refused) / 1000.0 if refused else None


class _RedisSlidingLogThrottle(SimpleRateThrottle):
    """SimpleRateThrottle's rate parsing, keys and settings (THROTTLE_RATES, cache_format) over a Redis sorted
    set. A cache (Redis) outage must not take the API down with it: fail open; health reports the outage."""

    num_requests: int | None  # set by SimpleRateThrottle.__init__ from the rate
    duration: int | None
    _wait_s: float | None = None

    def limit(self, request: Request, view: APIView) -> tuple[str, int, int] | None:
        """(key, window_s, limit) for this request, or None when this throttle does not apply to it."""
        if self.rate is None or getattr(view, "throttle_exempt", False):
            return None
        key = self.get_cache_key(request, view)
        if key is None:
            return None
        assert self.num_requests is not None and self.duration is not None
        return key, int(self.duration), int(self.num_requests)

    def allow_request(self, request: Request, view: APIView) -> bool:
        limit = self.limit(request, view)
        if limit is None:
            return True
        self._wait_s = _check([limit])
        return self._wait_s is None

    def wait(self) -> float | None:
        return self._wait_s


class TokenRateThrottle(_RedisSlidingLogThrottle):
    scope = "token"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        token = getattr(request, "auth", None)
        if token is not None and hasattr(token, "pk"):
            return self.cache_format % {"scope": self.scope, "ident": f"t{token.pk}"}
        if request.user and request.user.is_authenticated:
            return self.cache_format % {"scope": self.scope, "ident": f"u{request.user.pk}"}
        return None


class IpRateThrottle(_RedisSlidingLogThrottle):
    scope = "ip"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class ApiRateThrottle(BaseThrottle):
    """The API's default: the token's (or session user's) limit and the address's, judged in one round trip with
    the semantics of listing TokenRateThrottle and IpRateThrottle one after the other (see _SLIDING_LOG)."""

    parts: tuple[type[_RedisSlidingLogThrottle], ...] = (TokenRateThrottle, IpRateThrottle)

    def __init__(self) -> None:
        self._throttles = [part() for part in self.parts]
        self._wait_s: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        limits = [limit for throttle in self._throttles if (limit := throttle.limit(request, view)) is not None]
        self._wait_s = _check(limits)
        return self._wait_s is None

    def wait(self) -> float | None:
        return self._wait_s
