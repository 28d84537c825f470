"""The torch probe: a real run on the CPU, the GPU branch's logic with torch.cuda stubbed, the CLI, no-torch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workers.gpu.specs import get_spec
from workers.probes import torch_probe
from workers.probes.torch_probe import ProbeUnavailable, compare, run_probe

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


def test_cpu_probe_measures_small_sizes_quickly_and_does_not_compare() -> None:
    began = time.monotonic()
    result = run_probe("cpu", repeats=2)
    assert time.monotonic() - began < 20
    assert result.device == "cpu" and result.model is None
    assert result.matmul_size == 256 and result.copy_mib == 8
    assert result.fp32_tflops > 0 and math.isfinite(result.fp32_tflops)
    assert result.bandwidth_gbs > 0
    assert result.fp16_tflops is None
    assert result.comparison == "n/a" and result.degraded is False and result.ratios == {} and result.spec is None
    assert json.loads(json.dumps(result.to_dict()))["comparison"] == "n/a"


def test_probe_leaves_the_fp32_matmul_precision_as_it_found_it() -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        run_probe("cpu", size=64, repeats=1, copy_mib=1)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_compare_flags_figures_below_the_threshold() -> None:
    a100 = get_spec("A100-80GB")
    ratios, below = compare(
        {"fp32_tflops": 15.6, "fp16_tflops": 250.0, "bf16_tflops": 140.0, "bandwidth_gbs": 1_600.0}, a100, 0.5
    )
    assert ratios == {"fp32_tflops": 0.8, "fp16_tflops": 0.801, "bf16_tflops": 0.449, "bandwidth_gbs": 0.785}
    assert below == ["bf16_tflops"]
    # Volta has no bf16 tensor cores: a missing figure on either side is not compared, never "degraded".
    ratios, below = compare(
        {"fp32_tflops": 14.0, "bf16_tflops": None, "bandwidth_gbs": 800.0}, get_spec("V100-32GB"), 0.85
    )
    assert set(ratios) == {"fp32_tflops", "bandwidth_gbs"} and below == []


class FakeCuda:
    """Stands in for torch.cuda on this CPU-only machine; only device queries, no kernels."""

    def __init__(self, name: str, memory_gib: int, major: int) -> None:
        self.props = SimpleNamespace(name=name, total_memory=memory_gib * GIB, major=major, minor=0)
        self.synced = 0

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, device: Any) -> Any:
        return self.props

    def mem_get_info(self, device: Any) -> tuple[int, int]:
        return (2 * GIB, self.props.total_memory)

    def synchronize(self, device: Any = None) -> None:
        self.synced += 1

    def empty_cache(self) -> None:
        pass


def stub_gpu(
    monkeypatch: pytest.MonkeyPatch, name: str, memory_gib: int, major: int, figures: dict[Any, float], bandwidth: float
) -> list[tuple[Any, int]]:
    seen: list[tuple[Any, int]] = []
    monkeypatch.setattr(torch, "cuda", FakeCuda(name, memory_gib, major))

    def matmul(_torch: Any, device: Any, dtype: Any, n: int, repeats: int, min_seconds: float) -> float:
        assert device.type == "cuda" and min_seconds >= 0.2
        seen.append((dtype, n))
        return figures[dtype]

    def copy(_torch: Any, device: Any, mib: int, repeats: int, min_seconds: float) -> float:
        seen.append(("copy", mib))
        return bandwidth

    monkeypatch.setattr(torch_probe, "_matmul_tflops", matmul)
    monkeypatch.setattr(torch_probe, "_copy_gbs", copy)
    return seen


def test_gpu_branch_detects_the_model_and_reports_a_healthy_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = stub_gpu(
        monkeypatch,
        "NVIDIA A100-SXM4-80GB",
        80,
        8,
        {torch.float32: 18.9, torch.float16: 251.0, torch.bfloat16: 255.0},
        1_650.0,
    )
    result = run_probe("cuda:0")
    assert result.model == "A100-80GB" and result.device == "cuda:0"
    assert seen == [(torch.float32, 8192), (torch.float16, 8192), (torch.bfloat16, 8192), ("copy", 512)]
    assert result.spec == {"fp32_tflops": 19.5, "fp16_tflops": 312.0, "bf16_tflops": 312.0, "bandwidth_gbs": 2039.0}
    assert result.ratios["fp32_tflops"] == 0.969 and result.ratios["bandwidth_gbs"] == 0.809
    assert result.comparison == "ok" and result.degraded is False


def test_gpu_branch_marks_a_slow_gpu_degraded_with_configurable_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_gpu(
        monkeypatch,
        "NVIDIA H100 80GB HBM3",
        80,
        9,
        {torch.float32: 30.0, torch.float16: 420.0, torch.bfloat16: 430.0},
        2_900.0,
    )
    relaxed = run_probe("cuda:0")
    assert relaxed.comparison == "ok"
    strict = run_probe("cuda:0", threshold=0.6)
    assert strict.degraded is True and strict.comparison == "degraded"
    assert strict.below == ["bf16_tflops", "fp16_tflops"]  # 420/756 = 0.556, 430/756 = 0.569
    assert "below 60% of spec" in torch_probe.format_result(strict)


def test_gpu_branch_skips_bf16_on_volta_and_unknown_models_are_not_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = stub_gpu(monkeypatch, "Tesla V100-SXM2-16GB", 16, 7, {torch.float32: 14.9, torch.float16: 100.0}, 800.0)
    volta = run_probe("cuda:0", size=4096)
    assert (torch.bfloat16, 4096) not in seen and volta.bf16_tflops is None
    assert volta.model == "V100-16GB" and volta.comparison == "ok"
    stub_gpu(monkeypatch, "NVIDIA L4", 22, 8, {torch.float32: 30.0, torch.float16: 120.0, torch.bfloat16: 120.0}, 300.0)
    unknown = run_probe("cuda:0")
    assert unknown.model == "L4-22GB" and unknown.comparison == "n/a" and not unknown.degraded
    assert any("no spec sheet" in n for n in unknown.notes)


def test_cuda_request_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():  # pragma: no cover - only on a GPU machine
        pytest.skip("CUDA present")
    with pytest.raises(ProbeUnavailable, match="CUDA is not available"):
        run_probe("cuda:0")


def test_missing_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(ProbeUnavailable, match=r"needs PyTorch.*pip install"):
        run_probe("cpu")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        run_probe("cpu", threshold=0)
    with pytest.raises(ProbeUnavailable, match="unsupported device type"):
        run_probe("meta")


def test_cli_prints_json_and_uses_exit_codes() -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.probes.torch_probe",
            "--device",
            "cpu",
            "--json",
            "--size",
            "64",
            "--copy-mib",
            "1",
            "--repeats",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["device"] == "cpu"
    if not torch.cuda.is_available():
        missing = subprocess.run(
            [sys.executable, "-m", "workers.probes.torch_probe", "--device", "cuda:0"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert missing.returncode == torch_probe.EXIT_UNAVAILABLE
        assert "probe unavailable: CUDA is not available" in missing.stderr
