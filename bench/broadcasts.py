"""What skipping unwatched groups saves the broadcaster (`apps.core.broadcast`, `portal.internals.channels_groups`).

    REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python -m bench.broadcasts [--messages 2000] [--rounds 3]

Sends `--messages` job-state messages to groups nobody watches (as most job groups are: a job's page is open for
few of its changes) through the process's broadcaster, with the membership check and without it (every message a
`group_send`), in interleaved rounds, and prints the process's CPU per message (all threads: the writer's queueing
and the loop thread's sends). Two paces: a burst (one drain takes many messages, one EXISTS pipeline per batch) and
paced at 2 ms (about one message per batch, as the scheduler and the worker send at 50 jobs/s). Compare the saving
with the CPU of a job in `bench/jobs_e2e.py` (docs/benchmarks.md): a job sends four or five such messages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    import django

    django.setup()


def _run(count: int, *, skip: bool, pace_s: float) -> float:
    """CPU microseconds per message for `count` messages, after the broadcaster has sent or dropped them all."""
    from apps.core import broadcast

    b = broadcast.broadcaster
    b.skip_unwatched = skip
    cpu0 = time.process_time()
    for n in range(count):
        b.send(f"job.{900_000_000 + n}", {"type": "job.message", "message": {"type": "state", "state": "running"}})
        if pace_s:
            time.sleep(pace_s)
    while not b.idle():
        time.sleep(0.001)
    return (time.process_time() - cpu0) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _setup()
    _run(200, skip=True, pace_s=0)  # the loop thread, the layer's connections
    _run(200, skip=False, pace_s=0)
    for pace_name, pace in (("burst", 0.0), ("paced 2 ms", 0.002)):
        results: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for skip in (True, False):
                results[skip].append(_run(args.messages, skip=skip, pace_s=pace))
        on, off = statistics.median(results[True]), statistics.median(results[False])
        print(
            f"{pace_name:>11}: skip unwatched {on:7.1f} µs/message, send every message {off:7.1f} µs/message "
            f"(saves {off - on:6.1f} µs; rounds on {[round(x) for x in results[True]]}, "
            f"off {[round(x) for x in results[False]]})"
        )


if __name__ == "__main__":
    main()
