"""Websocket broadcasts (`apps.core.broadcast`) go out in batches from one loop thread, in order, and only to
groups someone watches (`portal.internals.channels_groups`); job messages are the example."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.core import RedisChannelLayer

from apps.core import broadcast
from apps.jobs import events
from portal.internals.channels_groups import watched_groups


@pytest.fixture
def layer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The portal's channel layer (channels-redis on the test Redis), its group_send calls recorded."""
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    calls: list[str] = []
    original = layer.group_send

    async def recording(group: str, message: dict[str, Any]) -> None:
        calls.append(group)
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", recording)
    layer.recorded = calls  # type: ignore[attr-defined]
    return layer


def _join(layer: Any, job_id: int) -> str:
    async def join() -> str:
        channel = await layer.new_channel()
        await layer.group_add(events.group_name(job_id), channel)
        return str(channel)

    return async_to_sync(join)()


def _receive(layer: Any, channel: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    async def receive() -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            out.append(await asyncio.wait_for(layer.receive(channel), timeout))
        return out

    return async_to_sync(receive)()


def _leave(layer: Any, job_id: int, channel: str) -> None:
    async_to_sync(layer.group_discard)(events.group_name(job_id), channel)


def test_watched_jobs_get_their_messages_in_order_unwatched_ones_cost_no_send(layer: Any) -> None:
    watched, unwatched = 910_001, 910_002
    channel = _join(layer, watched)
    try:
        for seq in range(300):
            events._group_send(unwatched, {"type": "logs", "seq": seq})
            events._group_send(watched, {"type": "logs", "seq": seq})
        got = _receive(layer, channel, 300)
        assert [m["message"]["seq"] for m in got] == list(range(300))
        assert all(m["type"] == "job.message" for m in got)
        # Every unwatched message was decided before the last watched one was sent (one drain, in order).
        assert set(layer.recorded) == {events.group_name(watched)}
        assert len(layer.recorded) == 300
    finally:
        _leave(layer, watched, channel)


def _drained(timeout: float = 10.0) -> None:
    """Wait until the broadcaster has decided every queued message (sends go out from its loop thread)."""
    deadline = time.monotonic() + timeout
    while not broadcast.broadcaster.idle():
        assert time.monotonic() < deadline, "the broadcaster did not drain"
        time.sleep(0.01)


def test_a_page_that_joins_later_gets_what_follows(layer: Any) -> None:
    job = 910_003
    events._group_send(job, {"type": "state", "state": "queued"})  # nobody yet: not sent
    # Decided before the page joins (on a busy machine the loop thread may not have run yet).
    _drained()
    channel = _join(layer, job)
    try:
        events._group_send(job, {"type": "state", "state": "running"})
        got = _receive(layer, channel, 1)
        assert got[0]["message"]["state"] == "running"
    finally:
        _leave(layer, job, channel)


def test_every_group_is_sent_to_when_membership_cannot_be_asked() -> None:
    groups = {events.group_name(1), events.group_name(2)}
    unreachable = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:1", "socket_connect_timeout": 0.5}])
    assert async_to_sync(watched_groups)(unreachable, groups) is None
    assert async_to_sync(watched_groups)(InMemoryChannelLayer(), groups) is None


def test_membership_is_read_from_the_layers_group_sets(layer: Any) -> None:
    job = 910_004
    group = events.group_name(job)
    assert async_to_sync(watched_groups)(layer, {group}) == set()
    channel = _join(layer, job)
    assert async_to_sync(watched_groups)(layer, {group, events.group_name(910_005)}) == {group}
    _leave(layer, job, channel)
    assert async_to_sync(watched_groups)(layer, {group}) == set()


def test_a_batch_that_fails_does_not_stop_later_broadcasts(layer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    job = 910_006
    channel = _join(layer, job)
    original = broadcast.watched_groups
    failures = [RuntimeError("unexpected")]

    async def failing_once(layer: Any, groups: set[str]) -> set[str] | None:
        if failures:
            raise failures.pop()
        return await original(layer, groups)

    monkeypatch.setattr(broadcast, "watched_groups", failing_once)
    try:
        events._group_send(job, {"type": "state", "state": "lost in the failed batch"})
        deadline = time.monotonic() + 10
        while failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not failures
        events._group_send(job, {"type": "state", "state": "after"})
        got = _receive(layer, channel, 1)
        assert got[0]["message"]["state"] == "after"
    finally:
        _leave(layer, job, channel)


@pytest.mark.django_db
def test_scheduler_wake_ups_go_out_after_commit_and_stay_bounded(django_capture_on_commit_callbacks: Any) -> None:
    from apps.core.redis import get_redis

    redis = get_redis()
    redis.delete(events.WAKE_KEY)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        for n in range(events.WAKE_MAX + 20):
            events.wake_scheduler_on_commit(f"submitted-{n}")
        assert redis.llen(events.WAKE_KEY) == 0  # nothing before the commit: the scheduler would find no job
    assert len(callbacks) == events.WAKE_MAX + 20
    # No scheduler drains the list here: it keeps the newest WAKE_MAX reasons, newest first.
    assert redis.llen(events.WAKE_KEY) == events.WAKE_MAX
    assert redis.lindex(events.WAKE_KEY, 0) == f"submitted-{events.WAKE_MAX + 19}".encode()
    redis.delete(events.WAKE_KEY)
