"""Moved to workers.internals.kombu_clients; re-exported for callers not yet changed."""

from workers.internals.kombu_clients import reuse_redis_clients

__all__ = ["reuse_redis_clients"]
