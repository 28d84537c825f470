"""Telemetry ingest: the Redis contract is written in one call; bad, foreign and stale samples are not."""

from __future__ import annotations

import json
import time

import pytest

from apps.core.redis import get_redis
from apps.fleet.messages import MessageRejected
from apps.telemetry import keys, tasks
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.selectors import latest_samples, raw_history
from tests.fleet.util import registered_node, row, telemetry

pytestmark = pytest.mark.django_db


def _stats() -> dict[str, int]:
    return {k.decode(): int(v) for k, v in get_redis().hgetall(keys.STATS).items()}


def _fleet_keys() -> set[str]:
    return {k.decode() for k in get_redis().scan_iter(match="fleet:*")} - {keys.STATS}


def test_a_message_lands_in_latest_history_and_the_minute_accumulator() -> None:
    _, token = registered_node("n1")
    now = time.time()
    result = telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=40), row("GPU-n1-1", util=None)], ts=now))
    assert result.accepted == 2
    latest = latest_samples(["GPU-n1-0", "GPU-n1-1", "GPU-unknown"])
    assert set(latest) == {"GPU-n1-0", "GPU-n1-1"}
    sample = latest["GPU-n1-0"]
    assert sample == {
        "uuid": "GPU-n1-0",
        "node": "n1",
        "index": 0,
        "model": "A100-80GB",
        "util": 40,
        "mem_used": 1000,
        "mem_total": 81920,
        "temp": 60,
        "power": 300.5,
        "sm_clock": 1410,
        "tensor": 0.25,
        "ts": round(now, 3),
    }
    assert latest["GPU-n1-1"]["util"] is None
    assert raw_history("GPU-n1-0") == [{"ts": round(now, 3), "util": 40, "mem_used": 1000, "temp": 60, "power": 300.5}]
    minute = int(now // 60 * 60)
    acc = {k.decode(): v.decode() for k, v in get_redis().hgetall(keys.rollup_key(minute)).items()}
    assert acc["GPU-n1-0|n"] == "1" and acc["GPU-n1-0|u_s"] == "40" and acc["GPU-n1-0|u_lo"] == "40"
    assert "GPU-n1-1|u_n" not in acc and acc["GPU-n1-1|n"] == "1"
    assert get_redis().zscore(keys.ROLLUP_PENDING, minute) == minute
    assert _stats()["samples_accepted"] == 2
    assert float(get_redis().hget(keys.NODE_SEEN, "n1")) == round(now, 3)


def test_history_is_capped(settings) -> None:
    settings.TELEMETRY_HISTORY_SAMPLES = 5
    _, token = registered_node("n1", ("A100-80GB",))
    now = time.time()
    for i in range(8):
        telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=i)], ts=now - 8 + i, seq=i))
    hist = raw_history("GPU-n1-0")
    assert [h["util"] for h in hist] == [3, 4, 5, 6, 7]  # oldest first, last five
    assert get_redis().ttl(keys.hist_key("GPU-n1-0")) > 0


def test_min_max_and_sums_accumulate() -> None:
    _, token = registered_node("n1", ("A100-80GB",))
    base = time.time() // 60 * 60 + 1  # all in one minute
    if base + 5 > time.time() + 25:
        base -= 60
    for i, util in enumerate([30, 10, 90]):
        telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=util, temp=50 + i)], ts=base + i), now=base + 5)
    acc = {k.decode(): v.decode() for k, v in get_redis().hgetall(keys.rollup_key(int(base // 60 * 60))).items()}
    assert (acc["GPU-n1-0|u_lo"], acc["GPU-n1-0|u_hi"], acc["GPU-n1-0|u_s"]) == ("10", "90", "130")
    assert acc["GPU-n1-0|t_hi"] == "52"


def test_a_stale_message_is_dropped_and_counted(settings) -> None:
    _, token = registered_node("n1")
    result = telemetry_ingest(
        telemetry("n1", token, [row("GPU-n1-0")], ts=time.time() - settings.TELEMETRY_MAX_AGE_S - 1)
    )
    assert result.stale and result.accepted == 0
    assert _fleet_keys() == set()
    assert _stats()["messages_stale"] == 1


def test_a_message_from_the_future_is_refused(settings) -> None:
    _, token = registered_node("n1")
    with pytest.raises(MessageRejected):
        telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0")], ts=time.time() + settings.TELEMETRY_MAX_SKEW_S + 5))
    assert _fleet_keys() == set()


def test_rows_of_gpus_that_are_not_the_nodes_are_dropped() -> None:
    _, token1 = registered_node("n1")
    registered_node("n2")
    result = telemetry_ingest(telemetry("n1", token1, [row("GPU-n1-0"), row("GPU-n2-0"), row("GPU-nobody")]))
    assert result.accepted == 1 and result.rejected_rows == 2
    assert set(latest_samples(["GPU-n1-0", "GPU-n2-0", "GPU-nobody"])) == {"GPU-n1-0"}


@pytest.mark.parametrize(
    "payload",
    [
        lambda t: telemetry("n1", "gpn_0123456789_wrongwrongwrongwrongwrong", [row("GPU-n1-0")]),
        lambda t: telemetry("ghost", t, [row("GPU-n1-0")]),
        lambda t: {**telemetry("n1", t, [row("GPU-n1-0")]), "v": 9},
        lambda t: None,
        lambda t: {"type": "telemetry"},
    ],
)
def test_the_task_refuses_bad_messages_without_raising_or_writing(payload) -> None:
    _, token = registered_node("n1")
    tasks.ingest(payload(token))
    assert _fleet_keys() == set()
    assert _stats()["messages_rejected"] == 1


def test_out_of_range_rows_write_nothing_for_that_gpu() -> None:
    _, token = registered_node("n1")
    tasks.ingest(telemetry("n1", token, [row("GPU-n1-0", util=250), row("GPU-n1-1", temp=9000)]))
    assert latest_samples(["GPU-n1-0", "GPU-n1-1"]) == {}
    assert _stats()["rows_rejected"] == 2


def test_a_new_gpu_is_seen_without_waiting_for_the_cache(settings) -> None:
    settings.FLEET_NODE_CACHE_S = 3600
    _, token = registered_node("n1", ("A100-80GB",))
    telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0")]))  # cache loaded with one GPU
    from apps.fleet import auth, services
    from tests.fleet.util import gpu_reports

    node_id = auth.node_identity("n1").id
    services.node_register(node_id=node_id, gpus=gpu_reports("n1", ("A100-80GB", "H100-80GB")))
    auth.node_identity("n1").loaded_at -= 10  # past the refresh rate limit, still inside the cache lifetime
    result = telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0"), row("GPU-n1-1")]))
    assert result.accepted == 2


def test_latest_json_is_compact() -> None:
    _, token = registered_node("n1", ("A100-80GB",))
    telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0")]))
    raw = get_redis().hget(keys.LATEST, "GPU-n1-0").decode()
    assert " " not in raw and json.loads(raw)["uuid"] == "GPU-n1-0"


def test_a_gpu_reported_lost_becomes_lost_once_and_comes_back_on_registration() -> None:
    from apps.audit.models import AuditEvent
    from apps.fleet import services
    from apps.fleet.models import Gpu
    from tests.fleet.util import gpu_reports

    node, token = registered_node("n1")
    lost_row = row(
        "GPU-n1-1", util=None, mem=None, temp=None, power=None, sm=None, tensor=None, extra={"h": {"lost": True}}
    )
    for _ in range(3):
        telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0"), lost_row]))
    assert Gpu.objects.get(uuid="GPU-n1-1").status == "lost"
    assert Gpu.objects.get(uuid="GPU-n1-0").status == "ok"
    assert AuditEvent.objects.filter(action="gpu.lost").count() == 1
    services.node_register(node_id=node.pk, gpus=gpu_reports("n1"))
    assert Gpu.objects.get(uuid="GPU-n1-1").status == "ok"
