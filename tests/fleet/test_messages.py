"""Agent message validation: every field is checked, before any database or Redis work."""

from __future__ import annotations

import math

import pytest

from apps.fleet.messages import (
    MessageRejected,
    check_heartbeat,
    check_probe_result,
    check_registration,
    check_row,
    check_telemetry,
)
from tests.fleet.util import registration, row, telemetry


def test_a_sound_registration_parses() -> None:
    reg = check_registration(registration("n1", "gpn_x"))
    assert [g.uuid for g in reg.gpus] == ["GPU-n1-0", "GPU-n1-1"]
    assert reg.gpus[1].model == "H100-80GB"
    assert reg.backend == "simulated"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: p.pop("node"), "malformed"),
        (lambda p: p.update(node="bad name; drop table"), "malformed"),
        (lambda p: p.update(token=123), "malformed"),
        (lambda p: p.update(gpus="all"), "malformed"),
        (lambda p: p["gpus"][0].update(index=-1), "out_of_range"),
        (lambda p: p["gpus"][0].update(index=True), "malformed"),
        (lambda p: p["gpus"][0].update(memory_mib=0), "out_of_range"),
        (lambda p: p["gpus"][0].update(memory_mib=10**12), "out_of_range"),
        (lambda p: p["gpus"][0].update(uuid="GPU-'\"<x>"), "malformed"),
        (lambda p: p["gpus"][1].update(uuid=p["gpus"][0]["uuid"]), "malformed"),
        (lambda p: p["gpus"][1].update(index=0), "malformed"),
        (lambda p: p["gpus"][0].update(mig_mode="yes"), "malformed"),
        (lambda p: p.update(gpus=[p["gpus"][0]] * 65), "out_of_range"),
        (lambda p: p.update(backend="docker"), "malformed"),
    ],
)
def test_a_bad_registration_is_refused(mutate, reason: str) -> None:
    payload = registration("n1", "gpn_x")
    mutate(payload)
    with pytest.raises(MessageRejected) as info:
        check_registration(payload)
    assert info.value.reason == reason


def test_not_an_object_is_refused() -> None:
    for payload in (None, [], "x", 5):
        with pytest.raises(MessageRejected):
            check_heartbeat(payload)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"util": 101}, "out_of_range"),
        ({"util": -1}, "out_of_range"),
        ({"util": 50.5}, "malformed"),
        ({"util": "50"}, "malformed"),
        ({"mem": 90000}, "out_of_range"),  # above mem_total
        ({"temp": 300}, "out_of_range"),
        ({"power": -5.0}, "out_of_range"),
        ({"power": math.inf}, "malformed"),
        ({"power": math.nan}, "malformed"),
        ({"power": 1e9}, "out_of_range"),
        ({"sm": 99999}, "out_of_range"),
        ({"tensor": 1.5}, "out_of_range"),
        ({"extra": "h"}, "malformed"),
    ],
)
def test_an_out_of_range_reading_is_refused(kwargs: dict, reason: str) -> None:
    with pytest.raises(MessageRejected) as info:
        check_row(row("GPU-1", **kwargs))
    assert info.value.reason == reason


def test_null_readings_are_fine() -> None:
    r = check_row(
        row(
            "GPU-1",
            util=None,
            mem=None,
            temp=None,
            power=None,
            sm=None,
            tensor=None,
            extra={"h": {"lost": True}, "e": "GPU lost"},
        )
    )
    assert r.util is None and r.lost is True


def test_one_bad_row_does_not_refuse_the_others() -> None:
    msg = check_telemetry(telemetry("n1", "gpn_x", [row("GPU-a"), row("GPU-b", util=900), [5], row("GPU-a")]))
    assert [r.uuid for r in msg.rows] == ["GPU-a"]
    assert [uuid for uuid, _ in msg.bad_rows] == ["GPU-b", "?", "GPU-a"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(type="register"),
        lambda p: p.update(v=2),
        lambda p: p.update(f=["uuid", "util"]),
        lambda p: p.pop("ts"),
        lambda p: p.update(ts="now"),
        lambda p: p.update(seq=-1),
        lambda p: p.update(g={"a": 1}),
    ],
)
def test_a_bad_telemetry_envelope_is_refused(mutate) -> None:
    payload = telemetry("n1", "gpn_x", [row("GPU-a")])
    mutate(payload)
    with pytest.raises(MessageRejected):
        check_telemetry(payload)


def test_probe_result_needs_a_result_or_an_error() -> None:
    base = {"node": "n1", "token": "gpn_x", "gpu_uuid": "GPU-1"}
    with pytest.raises(MessageRejected):
        check_probe_result(base)
    with pytest.raises(MessageRejected):
        check_probe_result({**base, "result": {"degraded": "yes"}})
    with pytest.raises(MessageRejected):
        check_probe_result({**base, "result": {"blob": "x" * 20_000}})
    assert check_probe_result({**base, "result": {"degraded": True}}).degraded is True
    assert check_probe_result({**base, "error": "no torch"}).result is None
