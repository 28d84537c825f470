"""Failed-login counting per username and per client IP, in the cache (Redis), fixed windows."""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)


def _keys(username: str, ip: str) -> list[str]:
    user_key = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:24]
    return [f"login-fail:u:{user_key}", f"login-fail:ip:{ip}"]


def is_locked(username: str, ip: str) -> bool:
    try:
        counts = cache.get_many(_keys(username, ip))
    except Exception:  # cache down: do not lock everyone out
        logger.warning("login rate limit unavailable (cache down)")
        return False
    return any(int(v) >= settings.LOGIN_RATE_LIMIT for v in counts.values())


def record_failure(username: str, ip: str) -> None:
    for key in _keys(username, ip):
        try:
            if not cache.add(key, 1, timeout=settings.LOGIN_RATE_WINDOW_S):
                cache.incr(key)
        except Exception:
            logger.warning("login rate limit unavailable (cache down)")
            return


def clear(username: str, ip: str) -> None:
    try:
        cache.delete(_keys(username, ip)[0])
    except Exception:
        return
