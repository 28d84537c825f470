"""Per-process caches whose entries expire after a few seconds.

Hot paths (a booking, a job submission) read small, slowly changing facts on every request: the booking policy,
the GPU models a set of names means, the fleet's shape. Reading them from the database each time costs more than
the request's own write; a stale answer for a few seconds is harmless because the database re-checks every
invariant that matters (constraints, row locks). Every such cache is a `TTLCache` created here, so that tests and
admin changes can drop them all at once with `clear_all()`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import cachetools

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_registry: weakref.WeakSet[TTLCache[object, object]] = weakref.WeakSet()


class TTLCache(Generic[K, V]):
    """A bounded map whose entries live `ttl_s` seconds; safe to share between the threads of one process."""

    def __init__(self, *, ttl_s: float, maxsize: int = 1024) -> None:
        self._data: cachetools.TTLCache[K, V] = cachetools.TTLCache(maxsize=maxsize, ttl=ttl_s)
        self._lock = threading.Lock()
        _registry.add(self)  # type: ignore[arg-type]

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._data.get(key)

    def set(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value

    def get_or_set(self, key: K, compute: Callable[[], V]) -> V:
        """The cached value, or `compute()` stored and returned. `compute` runs outside the lock: two threads
        missing at once both compute, which is cheaper than serializing every miss behind one query."""
        with self._lock:
            hit = self._data.get(key)
        if hit is not None:
            return hit
        value = compute()
        self.set(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def clear_all() -> None:
    """Drop every per-process cache (tests between cases; after an admin changes prices, models or policy)."""
    for cache in list(_registry):
        cache.clear()
