"""How many cancelled channel-layer receives keep running: channels-redis's own layer against the portal's
(apps/core/channel_layer.py), on the test's sweep (a receive cancelled at each of its first 40 loop steps, real
Redis, the portal's layer settings); and what the portal's receive costs more: CPU per send and receive of one
message, 3,000 in a row. Prints one line per layer and round.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m bench.channel_cancel [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django

django.setup()

from channels_redis.core import RedisChannelLayer as PlainLayer  # noqa: E402
from django.conf import settings  # noqa: E402

from apps.core.channel_layer import RedisChannelLayer  # noqa: E402
from tests.core.test_channel_layer import STEPS, steps_left_running  # noqa: E402


async def cpu_per_message_us(layer_class: type[Any], messages: int = 3000) -> float:
    layer = layer_class(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    try:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "warm"})
        await layer.receive(channel)
        started = time.process_time()
        for i in range(messages):
            await layer.send(channel, {"type": "m", "i": i})
            await layer.receive(channel)
        return (time.process_time() - started) / messages * 1e6
    finally:
        await layer.flush()
        await layer.close_pools()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for round_ in range(1, args.rounds + 1):
        for name, layer in (("channels-redis", PlainLayer), ("portal", RedisChannelLayer)):
            started = time.monotonic()
            left = asyncio.run(steps_left_running(layer))
            cost = asyncio.run(cpu_per_message_us(layer))
            print(
                f"round {round_} {name:>14}: {len(left)} of {len(STEPS)} cancelled receives kept running "
                f"(at steps {left}); {time.monotonic() - started:.1f} s; {cost:.0f} µs CPU per send and receive"
            )


if __name__ == "__main__":
    main()
