"""The channel layer's `receive` ends when it is cancelled (apps/core/channel_layer.py): a websocket that closes
takes its consumer with it. Real Redis, the portal's layer settings (a socket timeout, so redis-py writes each
command under `asyncio.wait_for`, which on Python 3.11 can drop a cancellation)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings

from apps.core.channel_layer import RedisChannelLayer

# Cancelling at each of the first loop steps of a receive lands, for some of them, in the step after redis-py's
# write of the blocking pop finished: the window that Python 3.11's wait_for drops a cancellation in.
STEPS = range(0, 40)
# A receive that ignored its cancellation pops again after the layer's 5 s timeout: longer than this.
ENDS_WITHIN_S = 3.0


async def steps_left_running(layer_class: type[Any]) -> list[int]:
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    left: list[int] = []
    for steps in STEPS:
        layer = layer_class(**config)
        try:
            channel = await layer.new_channel()
            await layer.send(channel, {"type": "warm"})
            assert (await layer.receive(channel))["type"] == "warm"  # the pool is connected: no I/O before the pop
            task = asyncio.ensure_future(layer.receive(channel))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=ENDS_WITHIN_S)
            if not done:
                left.append(steps)
                while not task.done():  # stop it, so that it does not pop on past the test
                    task.cancel()
                    await asyncio.wait([task], timeout=1)
        finally:
            await layer.flush()
            await layer.close_pools()
    return left


def test_a_cancelled_receive_ends_at_every_step_of_its_first_command() -> None:
    """channels-redis's own layer leaves some of these receives running on Python 3.11 (bench/channel_cancel.py
    counts them; when it finds none, the upstream cause is gone and apps/core/channel_layer.py can go)."""
    assert asyncio.run(steps_left_running(RedisChannelLayer)) == []
