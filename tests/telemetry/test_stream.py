"""The lean path: agents XADD to fleet:ingest, the consumer stores whole batches in one pipeline."""

from __future__ import annotations

import json
import time

import pytest
from django.conf import settings as django_settings

from apps.core.redis import get_redis
from apps.telemetry import keys
from apps.telemetry.ingest import telemetry_ingest_batch
from apps.telemetry.selectors import latest_samples
from apps.telemetry.stream import StreamIngestor, ensure_group
from tests.fleet.util import registered_node, row, telemetry
from workers.transport import PortalLink, make_celery, make_stream_client

pytestmark = pytest.mark.django_db


def _stats() -> dict[str, int]:
    return {k.decode(): int(v) for k, v in get_redis().hgetall(keys.STATS).items()}


def test_a_batch_stores_the_good_and_counts_the_rest(settings) -> None:
    _, t1 = registered_node("n1")
    _, t2 = registered_node("n2", ("L40S-48GB",))
    now = time.time()
    result = telemetry_ingest_batch(
        [
            telemetry("n1", t1, [row("GPU-n1-0", util=10), row("GPU-n1-1", util=900)], ts=now),
            telemetry("n2", t2, [row("GPU-n2-0", util=20)], ts=now),
            telemetry("n2", t1, [row("GPU-n2-0", util=99)], ts=now),  # n1's token for n2
            telemetry("n1", t1, [row("GPU-n1-0", util=30)], ts=now - settings.TELEMETRY_MAX_AGE_S - 5),
            None,
        ],
        now=now,
    )
    assert (result.messages, result.accepted_samples, result.stale, result.rejected, result.rejected_rows) == (
        5,
        2,
        1,
        2,
        1,
    )
    latest = latest_samples(["GPU-n1-0", "GPU-n1-1", "GPU-n2-0"])
    assert latest["GPU-n1-0"]["util"] == 10 and latest["GPU-n2-0"]["util"] == 20 and "GPU-n1-1" not in latest
    stats = _stats()
    assert stats["samples_accepted"] == 2 and stats["messages_stale"] == 1 and stats["messages_rejected"] == 2
    assert stats["rejected:bad_token"] == 1 and stats["rejected:malformed"] == 1 and stats["rows_rejected"] == 1


def test_the_agent_link_and_the_consumer_meet_on_the_stream() -> None:
    _, token = registered_node("n1")
    ingestor = StreamIngestor(block_ms=100)
    ensure_group(ingestor.redis)
    url = django_settings.REDIS.redis_py_url
    link = PortalLink(make_celery(url, "n1"), node="n1", token=token, stream=make_stream_client(url))
    link.start()
    try:
        for seq in range(3):
            message = telemetry("n1", token, [row("GPU-n1-0", util=seq), row("GPU-n1-1")], seq=seq)
            message.pop("token")  # the link adds it, as for the sampler's messages
            link.telemetry(message)
        deadline = time.monotonic() + 5
        while ingestor.totals.messages < 3 and time.monotonic() < deadline:
            ingestor.poll_once()
    finally:
        link.stop()
    assert ingestor.totals.messages == 3 and ingestor.totals.accepted_samples == 6
    assert latest_samples(["GPU-n1-0"])["GPU-n1-0"]["util"] == 2
    assert get_redis().xlen(keys.INGEST_STREAM) == 0  # consumed entries are deleted


def test_old_entries_are_trimmed_not_replayed() -> None:
    _, token = registered_node("n1")
    r = get_redis()
    ingestor = StreamIngestor(block_ms=100)
    ensure_group(r)
    old_ms = int((time.time() - 3600) * 1000)
    r.xadd(keys.INGEST_STREAM, {"m": json.dumps(telemetry("n1", token, [row("GPU-n1-0")]))}, id=f"{old_ms}-0")
    r.xadd(keys.INGEST_STREAM, {"m": json.dumps(telemetry("n1", token, [row("GPU-n1-1")]))})
    ingestor.poll_once()
    assert set(latest_samples(["GPU-n1-0", "GPU-n1-1"])) == {"GPU-n1-1"}


def test_the_consumer_recreates_its_group_after_a_redis_flush() -> None:
    _, token = registered_node("n1")
    r = get_redis()
    ingestor = StreamIngestor(block_ms=100)
    ensure_group(r)
    r.delete(keys.INGEST_STREAM)  # what a Redis restart without persistence does
    assert ingestor.poll_once().messages == 0
    r.xadd(keys.INGEST_STREAM, {"m": json.dumps(telemetry("n1", token, [row("GPU-n1-0")]))})
    assert ingestor.poll_once().accepted_samples == 1


def test_undecodable_entries_are_refused() -> None:
    registered_node("n1")
    r = get_redis()
    ingestor = StreamIngestor(block_ms=100)
    ensure_group(r)
    r.xadd(keys.INGEST_STREAM, {"m": b"{not json"})
    r.xadd(keys.INGEST_STREAM, {"other": b"x"})
    assert ingestor.poll_once().rejected == 2
