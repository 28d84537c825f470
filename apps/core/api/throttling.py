"""Rate limits per token (or session user) and per client IP; 429 carries Retry-After."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from rest_framework.throttling import SimpleRateThrottle

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


# After a cache failure, skip rate limiting in this process for this long: a Redis that hangs (rather than refusing
# connections) would otherwise cost every request the cache's socket timeout, twice (token and address).
CACHE_RETRY_AFTER_S = 5.0
_cache_down_until = 0.0


class _FailOpenThrottle(SimpleRateThrottle):
    """A cache (Redis) outage must not take the API down with it: fail open; health reports the outage."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        global _cache_down_until
        if getattr(view, "throttle_exempt", False) or time.monotonic() < _cache_down_until:
            return True
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # redis.ConnectionError, TimeoutError and friends
            _cache_down_until = time.monotonic() + CACHE_RETRY_AFTER_S
            logger.warning("rate limiting skipped, cache unavailable: %s", exc.__class__.__name__)
            return True


class TokenRateThrottle(_FailOpenThrottle):
    scope = "token"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        token = getattr(request, "auth", None)
        if token is not None and hasattr(token, "pk"):
            return self.cache_format % {"scope": self.scope, "ident": f"t{token.pk}"}
        if request.user and request.user.is_authenticated:
            return self.cache_format % {"scope": self.scope, "ident": f"u{request.user.pk}"}
        return None


class IpRateThrottle(_FailOpenThrottle):
    scope = "ip"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
