"""What the workers' private-internals machinery saves, as a share of the path it sits on (CPU, in-process).

    REDIS_URL=redis://127.0.0.1:6379/14 python bench/internals_workers.py [--tree DIR] [--rounds 3]

Two pieces are measured against plain Celery, each in interleaved A/B rounds with ``time.process_time`` (all
threads of this process; children such as a job's own process are not counted):

- the hand-built Celery message (``celery_wire.publish``: one LPUSH) against ``app.send_task`` for the same
  message, alone and on the path it sits on: one job end to end on a node agent (``JobRunner`` launching a short
  job through the process runtime, its reports leaving through ``PortalLink`` to the broker);
- the kombu patch (``broker.reuse_redis_clients``: one redis-py client per channel) against kombu as released,
  alone (one ``send_task``) and on its path: one task sent and run by a Celery worker in this process (solo pool,
  late acks with kombu's ack emulation, as the portal's worker runs).

The pieces and the rest of the path come from the tree given by ``--tree`` (default: this checkout; another commit
through ``git worktree add /tmp/wt <commit>``). Redis is a real
server (REDIS_URL); nothing leaves the machine. On a shared machine the numbers are noisy: compare the shares,
not the microseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUNDS = 3


def _cpu(fn: Callable[[], None]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _interleaved(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median over rounds of each variant's CPU per operation, the variants alternating within every round."""
    seen: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            seen[name].append(variants[name]())
    return {name: statistics.median(values) for name, values in seen.items()}


class KombuPatch:
    """Switches the kombu patch on and off (the released method is kept to put back)."""

    def __init__(self) -> None:
        from kombu.transport import redis as kombu_redis

        self.channel = kombu_redis.Channel
        self.released = self.channel.conn_or_acquire

    def on(self) -> None:
        try:
            from workers.internals.kombu_clients import reuse_redis_clients
        except ImportError:  # a tree from before the pieces moved
            from workers.broker import reuse_redis_clients

        self.channel.conn_or_acquire = self.released
        assert reuse_redis_clients()

    def off(self) -> None:
        self.channel.conn_or_acquire = self.released


def bench_message(broker_url: str, redis_url: str, patch: KombuPatch, n: int, rounds: int) -> dict[str, float]:
    import redis
    from celery import Celery

    try:
        from workers.internals import celery_wire
    except ImportError:  # a tree from before the pieces moved
        from workers import celery_wire  # type: ignore[no-redef]

    client = redis.Redis.from_url(redis_url)
    app = Celery(f"bench-{uuid.uuid4().hex[:6]}", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True)
    queue = f"bench.{uuid.uuid4().hex}"
    payload = [{"node": "gpu-01", "token": "t" * 43, "ts": 1.0, "job_id": 7, "state": "succeeded", "exit_code": 0}]

    def wire() -> float:
        def run() -> None:
            for _ in range(n):
                celery_wire.publish(client, "jobs.report_exit", payload, queue=queue, argsrepr="(jobs.report_exit)")

        return _cpu(run) / n

    def send_task(patched: bool) -> Callable[[], float]:
        def variant() -> float:
            patch.on() if patched else patch.off()

            def run() -> None:
                for _ in range(n):
                    app.send_task(
                        "jobs.report_exit",
                        args=payload,
                        queue=queue,
                        ignore_result=True,
                        argsrepr="(jobs.report_exit)",
                        kwargsrepr="{}",
                    )

            return _cpu(run) / n

        return variant

    try:
        with app.connection_for_write() as conn:  # the first send pays for connecting; not part of a message
            conn.ensure_connection()
        send_task(False)()
        wire()
        return _interleaved({"wire": wire, "send_task": send_task(False), "send_task+patch": send_task(True)}, rounds)
    finally:
        patch.off()
        client.delete(queue)
        client.close()
        app.close()


def bench_agent_job(broker_url: str, redis_url: str, patch: KombuPatch, n: int, rounds: int) -> dict[str, float]:
    """One short job on a node agent: launch, watch, its reports sent to the broker (two messages: logs, exit)."""
    from workers.agent_jobs import JobRunner, node_policy
    from workers.runtimes.process import ProcessRuntime
    from workers.transport import PortalLink, make_celery, make_stream_client

    patch.off()
    state = Path(tempfile.mkdtemp(prefix="bench-internals-"))
    app = make_celery(broker_url, f"bench-{uuid.uuid4().hex[:6]}")
    patch.off()  # make_celery installs it; the variants choose
    redis_client = make_stream_client(redis_url)
    next_id = [1]

    def variant(wire: bool, patched: bool) -> Callable[[], float]:
        def run_jobs() -> float:
            patch.on() if patched else patch.off()
            link = PortalLink(app, node="bench", token="t" * 43, broker=redis_client if wire else None)
            link.start()
            runner = JobRunner(
                sender=link,
                policy=node_policy(None),
                runtime_factory=lambda events: ProcessRuntime(state_dir=state, events=events, poll_interval_s=0.1),
            )
            runner.start()
            try:
                start = time.process_time()
                for _ in range(n):
                    job_id = next_id[0]
                    next_id[0] += 1
                    sent = link.stats.sent
                    request = {"job_id": job_id, "image": "local/process", "command": ["echo", "done"]}
                    assert runner.launch(request)
                    while link.stats.sent < sent + 2:  # its lines, then its exit (with its start)
                        time.sleep(0.001)
                cpu = time.process_time() - start
            finally:
                runner.stop()
                link.stop()
            return cpu / n

        return run_jobs

    try:
        variant(True, False)()
        return _interleaved(
            {"wire": variant(True, False), "send_task": variant(False, False), "send_task+patch": variant(False, True)},
            rounds,
        )
    finally:
        patch.off()
        redis_client.delete("control")
        redis_client.close()
        app.close()


def bench_worker_task(broker_url: str, redis_url: str, patch: KombuPatch, n: int, rounds: int) -> dict[str, float]:
    """One task sent, received, run and acked by a Celery worker in this process."""
    import redis
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery(f"bench-{uuid.uuid4().hex[:6]}", broker=broker_url, set_as_current=False)
    queue = f"bench.{uuid.uuid4().hex}"
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_default_queue=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=4,
        broker_transport_options={"visibility_timeout": 3600},
    )
    done = threading.Semaphore(0)

    @app.task(name="bench.noop", ignore_result=True)
    def noop(body: dict[str, Any]) -> None:
        done.release()

    def variant(patched: bool) -> Callable[[], float]:
        def run() -> float:
            patch.on() if patched else patch.off()
            start = time.process_time()
            for i in range(n):
                noop.apply_async(args=[{"i": i}], queue=queue)
            for _ in range(n):
                done.acquire()
            return (time.process_time() - start) / n

        return run

    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=10):
            variant(False)()
            return _interleaved({"released": variant(False), "patch": variant(True)}, rounds)
    finally:
        patch.off()
        redis.Redis.from_url(redis_url).delete(queue)
        app.close()


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:8.0f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=".", help="checkout whose workers/ holds the pieces (default: here)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--tasks", type=int, default=800)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from workers.transport import broker_url_for

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
    broker_url = broker_url_for(redis_url)
    patch = KombuPatch()
    rounds = max(3, args.rounds)

    message = bench_message(broker_url, redis_url, patch, args.messages, rounds)
    job = bench_agent_job(broker_url, redis_url, patch, args.jobs, rounds)
    task = bench_worker_task(broker_url, redis_url, patch, args.tasks, rounds)

    print(f"CPU per operation, median of {rounds} interleaved rounds (noisy on a shared machine)")
    print("celery_wire (hand-built message) vs send_task:")
    for name, value in message.items():
        print(f"  one message, {name:16s} {_us(value)}")
    for name, value in job.items():
        print(f"  one agent job,  {name:15s} {_us(value)}")
    saved = job["send_task"] - job["wire"]
    print(f"  share of the agent's job path saved by celery_wire: {saved / job['send_task']:6.1%}")
    # On a node the launch command also arrives through the agent's Celery worker: about one task's worth more.
    with_receipt = job["send_task"] + task["released"]
    print(f"  ... counting the launch command's receipt as well:  {saved / with_receipt:6.1%}")
    print("kombu patch (one redis-py client per channel) vs kombu as released:")
    print(f"  one send_task: patch saves {_us(message['send_task'] - message['send_task+patch'])}")
    print(f"  one agent job: patch saves {_us(job['send_task'] - job['send_task+patch'])}")
    for name, value in task.items():
        print(f"  one task through a worker, {name:9s} {_us(value)}")
    saved = task["released"] - task["patch"]
    print(f"  share of the worker's task path saved by the patch: {saved / task['released']:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
