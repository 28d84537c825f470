"""workers.internals.kombu_clients: kombu's Redis channel reuses one redis-py client (a private redis-server)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection

from tests.support.private_services import PrivateRedis
from workers.internals.kombu_clients import reuse_redis_clients

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with PrivateRedis() as private:
        yield private


def test_a_channel_keeps_its_client_until_kombu_replaces_the_pool(server: PrivateRedis) -> None:
    assert reuse_redis_clients() and reuse_redis_clients()  # idempotent
    with Connection(server.url(0)) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
        mine = redis.Redis.from_url(server.url(0))
        with channel.conn_or_acquire(client=mine) as given:
            assert given is mine
        channel._disconnect_pools()  # what kombu does after a fork
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()


def test_messages_published_and_acked_from_threads_arrive_once(server: PrivateRedis) -> None:
    reuse_redis_clients()
    per_thread, threads = 150, 4
    with Connection(server.url(0)) as conn:
        queue = conn.SimpleQueue("broker-test")

        def publish(n: int) -> None:
            for i in range(per_thread):
                queue.put({"n": n, "i": i})

        workers = [threading.Thread(target=publish, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

        seen: list[tuple[int, int]] = []
        lock = threading.Lock()

        def consume() -> None:
            with Connection(server.url(0)) as own:
                q = own.SimpleQueue("broker-test")
                while True:
                    try:
                        message = q.get(timeout=1)
                    except q.Empty:
                        return
                    with lock:
                        seen.append((message.payload["n"], message.payload["i"]))
                    message.ack()
                q.close()

        consumers = [threading.Thread(target=consume) for _ in range(3)]
        for consumer in consumers:
            consumer.start()
        for consumer in consumers:
            consumer.join()
        queue.close()

    assert sorted(seen) == [(n, i) for n in range(threads) for i in range(per_thread)]
    r = redis.Redis.from_url(server.url(0))
    assert r.llen("broker-test") == 0
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0  # every ack reached Redis
