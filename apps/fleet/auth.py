"""Who is talking: a node's token checked against its digest, with a short per-process cache.

Every agent message (telemetry once a second per node) names its node and carries the node's token. Looking the
node up in the database for every message would cost a query per node per second; instead each worker process
keeps the node's digest and GPU map for `FLEET_NODE_CACHE_S` seconds. A rotated token or a new GPU is therefore
seen within that time (a GPU uuid the cache does not know triggers an early refresh, at most once per
`_REFRESH_MIN_S`, so a fresh registration is picked up at once).
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from django.conf import settings

from apps.accounts import tokens
from apps.core.ttlcache import TTLCache
from apps.fleet.messages import MessageRejected
from apps.fleet.models import Gpu, Node

NODE_TOKEN_KIND = "gpn"  # noqa: S105 - the token kind prefix, not a secret
_REFRESH_MIN_S = 2.0


@dataclass(frozen=True)
class GpuRef:
    """What ingest needs to know about a GPU, without touching the database."""

    id: int
    index: int
    model: str
    status: str = "ok"


@dataclass
class NodeIdentity:
    """A node as the cache knows it."""

    id: int
    name: str
    digest: str
    status: str
    gpus: dict[str, GpuRef] = field(default_factory=dict)
    loaded_at: float = 0.0  # monotonic; an early refresh waits _REFRESH_MIN_S after it


# Node name -> identity; a None entry is a node forgotten (the next message loads it again). Room for every node of
# a large fleet: an eviction would cost a query per message of that node.
_cache: TTLCache[str, NodeIdentity | None] = TTLCache(ttl_s=settings.FLEET_NODE_CACHE_S, maxsize=100_000)


def _load(name: str) -> NodeIdentity | None:
    node = Node.objects.filter(name=name).values("id", "name", "token_digest", "status").first()
    if node is None:
        return None
    gpus = {
        uuid: GpuRef(id=gpu_id, index=index, model=model, status=status)
        for uuid, gpu_id, index, model, status in Gpu.objects.filter(
            node_id=node["id"], retired_at__isnull=True
        ).values_list("uuid", "id", "index", "model__name", "status")
    }
    return NodeIdentity(
        id=node["id"],
        name=node["name"],
        digest=node["token_digest"],
        status=node["status"],
        gpus=gpus,
        loaded_at=time.monotonic(),
    )


def node_identity(name: str, *, refresh: bool = False) -> NodeIdentity | None:
    """The cached identity of a node (loaded when missing, expired or `refresh`), None when no such node."""
    ident = _cache.get(name)
    if ident is not None and (not refresh or time.monotonic() - ident.loaded_at < _REFRESH_MIN_S):
        return ident
    fresh = _load(name)
    _cache.set(name, fresh)
    return fresh


def forget(name: str | None = None) -> None:
    """Drop one node (or all) from this process's cache, e.g. after a registration or a token rotation."""
    if name is None:
        _cache.clear()
    else:
        _cache.set(name, None)


def node_authenticate(name: str, token: str) -> NodeIdentity:
    """The node, if `token` is its current token; MessageRejected("unknown_node" | "bad_token") otherwise."""
    ident = node_identity(name)
    if ident is None:
        raise MessageRejected("unknown_node", name)
    parts = tokens.split(token)
    if not ident.digest or parts is None or parts[0] != NODE_TOKEN_KIND:
        raise MessageRejected("bad_token", name)
    if not hmac.compare_digest(tokens.digest_of(token), ident.digest):
        # The token may have been rotated since we cached the digest: look once more before refusing.
        ident = node_identity(name, refresh=True)
        if ident is None or not hmac.compare_digest(tokens.digest_of(token), ident.digest):
            raise MessageRejected("bad_token", name)
    return ident
