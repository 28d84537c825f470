"""Rate limits per token (or session user) and per client IP; 429 carries Retry-After.

DRF's SimpleRateThrottle keeps each client's request times as a pickled list in the cache and reads and writes
the whole list on every request: two round trips per throttle, and a payload that grows with the rate. All load
clients behind one address share the IP's list (1,800 entries at 30 requests/s), so every request pickled,
shipped and unpickled ~16 KB twice, and throttling was a quarter of the web process's time under load
(py-spy, bench/load_test.py). Here the same sliding log lives in a Redis sorted set, trimmed, counted and
appended by one Lua script: one round trip per throttle, O(log n) work in Redis, a few bytes over the wire.
The semantics stay DRF's: N requests in any window of the rate's length, refused requests are not counted, and
Retry-After is the time until the oldest counted request leaves the window.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rest_framework.throttling import SimpleRateThrottle

if TYPE_CHECKING:
    import redis
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


# After a cache failure, skip rate limiting in this process for this long: a Redis that hangs (rather than refusing
# connections) would otherwise cost every request the client's socket timeout, twice (token and address).
CACHE_RETRY_AFTER_S = 5.0
_cache_down_until = 0.0

# KEYS[1]: the client's sorted set (score = request time in ms). ARGV: now_ms, window_ms, limit, member.
# Returns {1, 0} when the request is allowed (and recorded), {0, wait_ms} when it is refused.
_SLIDING_LOG = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
  local wait = window
  if oldest[2] then wait = tonumber(oldest[2]) + window - now end
  return {0, wait}
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], window)
return {1, 0}
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


class _RedisSlidingLogThrottle(SimpleRateThrottle):
    """SimpleRateThrottle's rate parsing, keys and settings (THROTTLE_RATES, cache_format) over a Redis sorted
    set. A cache (Redis) outage must not take the API down with it: fail open; health reports the outage."""

    num_requests: int | None  # set by SimpleRateThrottle.__init__ from the rate
    duration: int | None
    _wait_s: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        global _cache_down_until
        if self.rate is None or getattr(view, "throttle_exempt", False) or time.monotonic() < _cache_down_until:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        assert self.num_requests is not None and self.duration is not None
        now_ms = int(time.time() * 1000)
        member = f"{now_ms}:{os.urandom(6).hex()}"  # unique: two requests in the same millisecond both count
        try:
            allowed, wait_ms = _script()(
                keys=[f"portal:{key}"], args=[now_ms, int(self.duration) * 1000, int(self.num_requests), member]
            )
        except Exception as exc:  # redis.ConnectionError, TimeoutError and friends
            _cache_down_until = time.monotonic() + CACHE_RETRY_AFTER_S
            logger.warning("rate limiting skipped, cache unavailable: %s", exc.__class__.__name__)
            return True
        if int(allowed):
            return True
        self._wait_s = max(float(wait_ms) / 1000.0, 0.0)
        return False

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
