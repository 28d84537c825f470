"""The telemetry message format: compact rows, optional extras, round trip, refusal of unknown versions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.gpu.base import HEALTH_OK, GpuInfo, GpuSample, build_message, parse_message, sample_to_row


def busy(**overrides: object) -> GpuSample:
    values: dict[str, object] = {
        "uuid": "GPU-1",
        "ts": 10.0,
        "utilization_pct": 87,
        "memory_used_mib": 30_512,
        "memory_total_mib": 81_920,
        "temperature_c": 64,
        "power_w": 312.4,
        "sm_clock_mhz": 1_410,
        "tensor_active": 0.412,
    }
    values.update(overrides)
    return GpuSample(**values)  # type: ignore[arg-type]


def test_plain_row_is_positional_and_has_no_extras() -> None:
    assert sample_to_row(busy()) == ["GPU-1", 87, 30_512, 81_920, 64, 312.4, 1_410, 0.412]


def test_extras_carry_processes_problems_and_errors_only() -> None:
    row = sample_to_row(
        busy(processes=[(42, 30_000)], health={**HEALTH_OK, "xid": 2, "last_xid": 79}, error="power: Unknown Error")
    )
    assert row[8] == {"p": [[42, 30_000]], "h": {"xid": 2, "last_xid": 79}, "e": "power: Unknown Error"}
    # Sampled with no processes is different from not sampled: [] is sent, None is not.
    assert sample_to_row(busy(processes=[]))[8] == {"p": []}
    # A counter the GPU cannot report (None) is not a problem and is not sent.
    assert len(sample_to_row(busy(health={**HEALTH_OK, "ecc_dbe": None}))) == 8


def test_message_round_trip_and_size_for_eight_gpus() -> None:
    samples = [busy(uuid=f"GPU-{i:08x}-1111-2222-3333-444444444444") for i in range(8)]
    message = build_message("gpu-node-01", samples, ts=1_767_225_600.123456, seq=7)
    assert message["type"] == "telemetry" and message["v"] == 1 and message["ts"] == 1_767_225_600.123
    text = json.dumps(message, separators=(",", ":"))
    assert len(text) < 1_000  # ~100 bytes per GPU: what the agent sends every second
    node, ts, seq, decoded = parse_message(json.loads(text))
    assert (node, seq) == ("gpu-node-01", 7)
    assert decoded == [GpuSample(**{**s.__dict__, "ts": ts}) for s in samples]


def test_unknown_type_or_version_is_refused() -> None:
    message = build_message("n", [busy()], ts=1.0, seq=0)
    with pytest.raises(ValueError, match="not a v1 telemetry"):
        parse_message({**message, "v": 2})
    with pytest.raises(ValueError, match="columns"):
        parse_message({**message, "f": ["uuid", "util"]})
    with pytest.raises(ValueError, match="columns"):
        parse_message({**message, "g": [["GPU-1", 1]]})


def test_gpu_info_to_dict() -> None:
    info = GpuInfo(
        uuid="GPU-1", index=0, name="NVIDIA H200", model="H200-141GB", memory_mib=143_771, extra={"simulated": True}
    )
    assert info.to_dict() == {
        "uuid": "GPU-1",
        "index": 0,
        "name": "NVIDIA H200",
        "model": "H200-141GB",
        "memory_mib": 143_771,
        "mig_mode": False,
        "extra": {"simulated": True},
        "mig_devices": [],
    }


def test_agent_gpu_layer_imports_neither_django_nor_torch() -> None:
    # GPU nodes run the agent as plain Python; torch is optional and loaded only when a probe runs.
    code = (
        "import sys, workers.gpu.base, workers.gpu.specs, workers.gpu.nvml, workers.gpu.simulated, "
        "workers.sampler, workers.probes.torch_probe\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery', 'torch'))\n"
        "print(','.join(bad))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
