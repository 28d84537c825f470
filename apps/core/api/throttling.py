"""Rate limits per token (or session user) and per client IP; 429 carries Retry-After."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rest_framework.throttling import SimpleRateThrottle

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


class _FailOpenThrottle(SimpleRateThrottle):
    """A cache (Redis) outage must not take the API down with it: fail open; health reports the outage."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        if getattr(view, "throttle_exempt", False):
            return True
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # redis.ConnectionError and friends
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
