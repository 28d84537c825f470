"""Which channel-layer groups have a member, asked of channels-redis's own group sets (README.md).

A `group_send` costs two Redis round trips and a task on the event loop even when nobody is in the group, and most
groups the portal sends to are watched by nobody (a job's page is open for few of its state changes). One
pipelined EXISTS per batch of messages says which groups to send to.

Upstream names it depends on (channels-redis `RedisChannelLayer`): `_group_key(group)` (private: the sorted set
of a group's channels), `consistent_hash(name)` and `connection(index)` (public methods, undocumented). A layer
without them (another backend, a changed channels-redis) gets None: then every group is sent to, correct and only
slower.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_NEEDS = ("_group_key", "consistent_hash", "connection")


async def watched_groups(layer: Any, groups: set[str]) -> set[str] | None:
    """The groups with at least one member, or None when that cannot be asked (then send to every group)."""
    if not all(hasattr(layer, name) for name in _NEEDS):
        return None
    by_connection: dict[int, list[str]] = {}
    for group in groups:
        by_connection.setdefault(layer.consistent_hash(group), []).append(group)
    watched: set[str] = set()
    try:
        for index, names in by_connection.items():
            pipe = layer.connection(index).pipeline(transaction=False)
            for name in names:
                pipe.exists(layer._group_key(name))
            for name, present in zip(names, await pipe.execute(), strict=True):
                if present:
                    watched.add(name)
    except Exception as exc:  # Redis away: the sends would fail as well, and say so
        logger.warning("asking which channel-layer groups are watched failed: %s", exc)
        return None
    return watched
