"""The channel layer (settings.CHANNEL_LAYERS): channels-redis's, with a `receive` that stops when it is cancelled.

Why: when a websocket closes, Channels cancels its consumer's pending `receive` on the layer and waits for it to
end (channels.utils.await_many_dispatch). channels-redis receives by a blocking pop, and redis-py writes each
command under `asyncio.wait_for` when the connection has a socket timeout (ours does: settings.py). On Python 3.11,
`wait_for` drops a cancellation that arrives in the loop step after its inner write finished (it returns the
result instead; CPython gh-86296, fixed in 3.12 where `wait_for` is built on `asyncio.timeout`). The receive then
goes on popping, every 5 s, for a socket that is gone: the consumer never ends, and it holds its task and its
state until the process stops (a web server stop then waits out its grace period for it). Seen on about one
closed page in four on a quiet server; `tests/core/test_channel_layer.py` cancels receives at each loop step of
their first command and finds the plain layer's left running.

How: the layer's own receive runs in a task of its own; when the caller is cancelled, that task is cancelled
until it has ended. Only public API: the layer's `receive(channel)` (Channels' layer specification) and asyncio.
A message that the inner receive got just as it was cancelled is dropped, as it is with the plain layer: the
consumer that asked for it is going away.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

RECANCEL_EVERY_S = 0.5  # a receive blocked in its pop is woken by the next cancel at once; this only paces retries


class RedisChannelLayer(_RedisChannelLayer):  # type: ignore[misc]  # channels-redis is untyped
    async def receive(self, channel: str) -> dict[str, Any]:
        inner = asyncio.ensure_future(super().receive(channel))
        try:
            # shield: a cancellation of this call reaches `inner` only through the loop below, which repeats it
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            while not inner.done():
                inner.cancel()
                try:
                    await asyncio.wait([inner], timeout=RECANCEL_EVERY_S)
                except asyncio.CancelledError:
                    continue  # cancelled again (a server stopping): still see the inner receive end first
            if not inner.cancelled():
                inner.exception()  # retrieved: a message or an error that came as it was cancelled is dropped
            raise
