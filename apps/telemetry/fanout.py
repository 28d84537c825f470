"""Live fleet fan-out: one Redis pub/sub subscription per web process, fanned out in-process to the websockets.

Why this shape (bench/fleet_fanout.py measures it; docs/benchmarks.md): sending each snapshot through the channel
layer costs ~400 µs of CPU per delivery, so with 1,000 sockets the last one waits ~0.5 s. One subscription per
process with the fan-out done in the event loop costs ~30 µs per delivery. So:

- `FleetFanout` owns the process's single subscription to `keys.SNAPSHOTS_CHANNEL`: an asyncio task started
  lazily by the first websocket, which resubscribes with backoff when Redis goes away (pub/sub has no replay, so on
  every (re)subscribe it reads `keys.SNAPSHOT_LAST` to have something current at once).
- A `Snapshot` is parsed once; its JSON is serialized once per *visibility class* and cached on the snapshot. All
  signed-in users see every GPU (nodes are shared infrastructure) but a holder's details (user, id, until) only for
  their own teams; outsiders see the holder's team and kind. Likewise who uses a GPU outside the portal (a name only
  for the user's teammates, a uid no portal user has only for admins). The class of a viewer for a given snapshot
  is the set of its teams that actually hold (or use) a GPU in that snapshot, so everyone whose teams hold nothing
  shares one payload.
- Each websocket gets a `Subscriber`: a mailbox of the newest `size` payloads. When a client stops reading, its own
  send blocks (the server's transport pauses), its mailbox keeps only the newest snapshots and counts the ones it
  dropped; the fan-out loop itself never awaits a client, so one stalled socket cannot delay anyone else. The
  client sees the gap in `seq`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from apps.accounts.types import AnyUser
from apps.telemetry import keys
from apps.telemetry.outside import owner_as_seen, owner_teams

logger = logging.getLogger(__name__)

PUBLIC_HOLDER_FIELDS: Final = keys.PUBLIC_HOLDER_FIELDS

MAILBOX_SIZE: Final = 2  # newest snapshots kept per socket: one being sent + this many waiting ≈ 3 s of lag at most
_FULL: Final = "*"  # visibility class "every holder's details" (admins, or a viewer in every holding team)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Viewer:
    """What one websocket may see of holders: all of them (admins) or those of its own teams (slugs)."""

    sees_all: bool
    teams: frozenset[str] = frozenset()


def viewer_for(user: AnyUser) -> Viewer:
    """The viewer of a signed-in user; reads the database (call through database_sync_to_async from async code)."""
    from apps.accounts.models import Team

    if user.is_staff:
        return Viewer(sees_all=True)
    # Team.visible_to is the one place that says which teams a user is in.
    return Viewer(sees_all=False, teams=frozenset(Team.objects.visible_to(user).values_list("slug", flat=True)))


def _holders(gpu: dict[str, Any]) -> Iterable[dict[str, Any]]:
    holder = gpu.get("holder")
    if isinstance(holder, dict):
        return (holder,)
    if isinstance(holder, list):  # fractional shares may one day list several holders of one GPU
        return [h for h in holder if isinstance(h, dict)]
    return ()


def _outside(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """Whose processes use a GPU outside the portal (keys.SnapshotGpu.outside["by"])."""
    outside = gpu.get("outside")
    by = outside.get("by") if isinstance(outside, dict) else None
    return [o for o in by if isinstance(o, dict)] if isinstance(by, list) else []


def _public_holder(holder: Any) -> Any:
    if isinstance(holder, dict):
        return {k: holder[k] for k in PUBLIC_HOLDER_FIELDS if k in holder}
    if isinstance(holder, list):
        return [_public_holder(h) for h in holder]
    return holder


class Snapshot:
    """One published fleet snapshot, parsed once; its JSON is built once per visibility class and cached."""

    __slots__ = ("_doc", "_payloads", "holder_teams", "seq", "ts")

    def __init__(self, doc: dict[str, Any], raw: str | None = None) -> None:
        self._doc = doc
        self.seq: int | None = doc.get("seq") if isinstance(doc.get("seq"), int) else None
        self.ts: str = str(doc["ts"])
        self.holder_teams: frozenset[str] = frozenset(
            str(h["team"]) for g in doc["gpus"] if isinstance(g, dict) for h in _holders(g) if h.get("team")
        ) | frozenset(t for g in doc["gpus"] if isinstance(g, dict) for o in _outside(g) for t in owner_teams(o))
        # The publisher's own text is the full view: no need to serialize it again for admins.
        self._payloads: dict[str | frozenset[str], str] = {_FULL: raw} if raw is not None else {}

    @classmethod
    def parse(cls, raw: bytes | str) -> Snapshot:
        """A snapshot from the channel's JSON; ValueError when it is not one."""
        text = raw.decode() if isinstance(raw, bytes | bytearray) else raw
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
            raise ValueError("not a fleet snapshot (no gpus list)")
        complete = "type" in doc and "ts" in doc
        if doc.setdefault("type", "fleet") != "fleet":
            raise ValueError(f"not a fleet snapshot (type {doc['type']!r})")
        if not complete:
            # Every message a client gets carries type and ts (docs/api.md); add what the publisher left out.
            doc.setdefault("ts", _now_iso())
            return cls(doc)
        return cls(doc, raw=text)

    def visibility_class(self, viewer: Viewer) -> str | frozenset[str]:
        if viewer.sees_all or self.holder_teams <= viewer.teams:
            return _FULL
        return viewer.teams & self.holder_teams

    def payload_for(self, viewer: Viewer) -> str:
        """The JSON text this viewer gets: holder details only for its own teams (all of them for admins)."""
        cls = self.visibility_class(viewer)
        payload = self._payloads.get(cls)
        if payload is None:
            payload = self._payloads[cls] = self._render(cls)
        return payload

    def _render(self, cls: str | frozenset[str]) -> str:
        if cls == _FULL:
            return _dumps(self._doc)
        gpus = []
        for gpu in self._doc["gpus"]:
            if isinstance(gpu, dict) and gpu.get("holder") is not None:
                holders = list(_holders(gpu))
                if any(h.get("team") not in cls for h in holders):
                    if isinstance(gpu["holder"], list):
                        redacted: Any = [h if h.get("team") in cls else _public_holder(h) for h in holders]
                    else:
                        redacted = _public_holder(gpu["holder"])
                    gpu = {**gpu, "holder": redacted}
            if isinstance(gpu, dict) and isinstance(gpu.get("outside"), dict):
                by = [owner_as_seen(o, see_all=False, teams=cls) for o in _outside(gpu)]
                gpu = {**gpu, "outside": {**gpu["outside"], "by": by}}
            gpus.append(gpu)
        return _dumps({**self._doc, "gpus": gpus})

    def document_for(self, viewer: Viewer) -> dict[str, Any]:
        """The redacted snapshot as a dict (server-rendered initial page state)."""
        parsed: dict[str, Any] = json.loads(self.payload_for(viewer))
        return parsed


class Subscriber:
    """One websocket's mailbox: the newest `size` payloads. Older ones are dropped (and counted) when it falls
    behind, so the fan-out loop never waits for a client."""

    __slots__ = ("_box", "_ready", "_size", "delivered", "dropped", "viewer")

    def __init__(self, viewer: Viewer, size: int = MAILBOX_SIZE) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.viewer = viewer
        self._size = size
        self._box: deque[str] = deque()
        self._ready = asyncio.Event()
        self.delivered = 0  # payloads taken by the socket's sender
        self.dropped = 0  # payloads discarded because the socket was not keeping up

    def offer(self, payload: str) -> None:
        if len(self._box) >= self._size:
            self._box.popleft()
            self.dropped += 1
        self._box.append(payload)
        self._ready.set()

    async def next(self) -> str:
        """The oldest payload still in the mailbox, waiting for one if it is empty."""
        while not self._box:
            self._ready.clear()
            await self._ready.wait()
        self.delivered += 1
        return self._box.popleft()

    def pending(self) -> int:
        return len(self._box)


@dataclass
class FanoutStats:
    """Counters of the process's fan-out (read by tests and the benchmark)."""

    snapshots: int = 0  # distinct snapshots fanned out
    duplicates: int = 0  # a snapshot seen twice (SNAPSHOT_LAST read right after resubscribing), skipped
    invalid: int = 0
    subscribes: int = 0  # successful (re)subscriptions
    connection_errors: int = 0
    last_error: str | None = None
    fanout_seconds: float = 0.0  # loop time spent handing snapshots to mailboxes (CPU of the fan-out itself)
    extra: dict[str, int] = field(default_factory=dict)


def _default_client() -> aioredis.Redis:
    from django.conf import settings

    # No retries inside redis-py: the fan-out loop owns reconnection (with its own backoff and a fresh
    # subscription), and redis-py's default retry would sleep up to 10 s per attempt before telling it.
    return aioredis.Redis.from_url(settings.REDIS.redis_py_url, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0))


class FleetFanout:
    """The process's subscription to fleet snapshots and the sockets it feeds. Use one per event loop
    (`get_fanout()`); every method runs on that loop."""

    def __init__(
        self,
        *,
        client_factory: Callable[[], aioredis.Redis] = _default_client,
        channel: str = keys.SNAPSHOTS_CHANNEL,
        last_key: str = keys.SNAPSHOT_LAST,
        mailbox_size: int = MAILBOX_SIZE,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        idle_ping_s: float = 5.0,
        dead_after_s: float = 20.0,
    ) -> None:
        self._client_factory = client_factory
        self.channel = channel
        self.last_key = last_key
        self.mailbox_size = mailbox_size
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        # The publisher sends once a second: silence means a dead link (a half-open TCP connection raises no
        # error), so ping after idle_ping_s and give up on the connection after dead_after_s without any reply.
        self._idle_ping_s = idle_ping_s
        self._dead_after_s = dead_after_s
        self._subscribers: set[Subscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.latest: Snapshot | None = None
        self.stats = FanoutStats()
        self.subscribed = asyncio.Event()  # set while a subscription is live (tests wait on it)

    # --- sockets ---------------------------------------------------------------------------------------

    def attach(self, viewer: Viewer) -> Subscriber:
        """A mailbox for a new socket, primed with the latest snapshot; starts the subscription if needed."""
        sub = Subscriber(viewer, self.mailbox_size)
        self._subscribers.add(sub)
        self.start()
        if self.latest is not None:
            sub.offer(self.latest.payload_for(viewer))
        return sub

    def detach(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    # --- the subscription --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-fanout")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # redis-py 8 can swallow a cancellation that lands inside PubSub.get_message(timeout=...) (it returns
            # None instead), so the loop also checks this flag after every read.
            self._stopping = True
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        delay = self._backoff_initial_s
        while True:
            client = self._client_factory()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.stats.subscribes += 1
                self.subscribed.set()
                delay = self._backoff_initial_s
                # Subscribe first, then read the last snapshot: whatever is published in between arrives on the
                # subscription too (deduplicated by seq), so nothing falls into the gap.
                last = await client.get(self.last_key)
                if last is not None:
                    self.publish(last)
                await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the link means the same thing: reconnect
                self.stats.connection_errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                # Loud on the first failure and once retries reach the slowest pace; quiet in between.
                loud = self.stats.connection_errors == 1 or delay >= self._backoff_max_s
                (logger.warning if loud else logger.info)(
                    "fleet fan-out lost its Redis subscription (%s); retrying in %.1fs", exc, delay
                )
            finally:
                self.subscribed.clear()
                await _close_quietly(pubsub, client)
            if self._stopping:
                raise asyncio.CancelledError
            # Jitter: after a Redis restart every web process must not resubscribe in the same millisecond.
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._backoff_max_s)

    async def _listen(self, pubsub: Any) -> None:
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._idle_ping_s)
            if self._stopping:
                raise asyncio.CancelledError
            now = loop.time()
            if message is None:
                if now - last_heard > self._dead_after_s:
                    raise ConnectionError(f"no message or pong from Redis for {now - last_heard:.0f}s")
                await pubsub.ping()
                continue
            last_heard = now
            if message.get("type") == "message":
                self.publish(message["data"])

    def publish(self, raw: bytes | str) -> Snapshot | None:
        """Hand one snapshot (the channel's JSON) to every socket's mailbox. Public for tests and the benchmark."""
        try:
            snapshot = Snapshot.parse(raw)
        except (ValueError, TypeError, KeyError) as exc:
            self.stats.invalid += 1
            if self.stats.invalid == 1 or self.stats.invalid % 100 == 0:
                logger.warning("fleet fan-out ignored an unreadable snapshot (%s; %d so far)", exc, self.stats.invalid)
            return None
        if self.latest is not None and snapshot.seq is not None and snapshot.seq == self.latest.seq:
            self.stats.duplicates += 1
            return None
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.latest = snapshot
        self.stats.snapshots += 1
        for sub in tuple(self._subscribers):
            sub.offer(snapshot.payload_for(sub.viewer))
        self.stats.fanout_seconds += loop.time() - started
        return snapshot


async def _close_quietly(pubsub: Any, client: aioredis.Redis) -> None:
    for closer in (pubsub.aclose, client.aclose):
        try:
            await closer()
        except Exception:  # noqa: S110 - the link is already broken; closing is best effort
            pass


_instance: FleetFanout | None = None
_instance_loop: asyncio.AbstractEventLoop | None = None


def get_fanout() -> FleetFanout:
    """The fan-out of the running event loop (one web process = one loop = one subscription)."""
    global _instance, _instance_loop
    loop = asyncio.get_running_loop()
    if _instance is None or _instance_loop is not loop:
        # A new loop (tests start several) cannot reuse a task or an Event bound to the old one.
        _instance, _instance_loop = FleetFanout(), loop
    return _instance


def last_snapshot_document(*, viewer: Viewer) -> dict[str, Any] | None:
    """The last published snapshot redacted for `viewer`, read synchronously (page views), or None."""
    from apps.core.redis import get_redis

    try:
        raw = get_redis().get(keys.SNAPSHOT_LAST)
    except Exception:  # Redis down: the page still renders from the database and the socket catches up
        logger.warning("could not read %s", keys.SNAPSHOT_LAST, exc_info=True)
        return None
    if raw is None:
        return None
    try:
        return Snapshot.parse(raw).document_for(viewer)
    except (ValueError, TypeError, KeyError):
        return None
