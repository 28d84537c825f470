"""A short health probe of one GPU: matmul throughput and memory bandwidth, compared with the spec sheet.

Why: a GPU that throttles (broken fan, power cap, PCIe link trained down, a half-dead HBM stack) still passes
`nvidia-smi`; users notice only that their job is slow. The agent runs this probe when a GPU is idle (or an admin
asks) and the portal drains a GPU whose figures fall below `threshold` x spec.

Measured:
- matmul TFLOPS for fp32 (TF32 switched off, so it is comparable with the fp32 figure), fp16 and, on GPUs with
  bf16 tensor cores (compute capability 8.0+), bf16; 2*n^3 floating-point operations per nxn matmul;
- device memory bandwidth from a large device-to-device tensor copy, counting bytes read plus bytes written
  (the convention of the data-sheet figure, which is the sum of both directions).

Each figure is timed after warm-up, with `torch.cuda.synchronize` around the timed loop, and the loop is lengthened
until it lasts at least ~0.2 s so that launch overhead does not dominate on fast GPUs. On the CPU the probe runs
tiny sizes (for tests and for a smoke check of the code path) and the comparison is "n/a".

torch is optional for the node agent: it is imported only when a probe runs, with a clear error if missing.

    python -m workers.probes.torch_probe --device cuda:0 --json

Exit status: 0 probe ran and is fine (or n/a), 3 the GPU is degraded, 2 the probe could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from workers.gpu.specs import GpuSpec, model_key_for, spec_for_key

DEFAULT_THRESHOLD = 0.5
DEFAULT_REPEATS = 10
GPU_MATMUL_SIZE = 8192
CPU_MATMUL_SIZE = 256
GPU_COPY_MIB = 1024
CPU_COPY_MIB = 8
_MIN_TIMED_S_GPU = 0.2
_MIB = 1024 * 1024

EXIT_OK = 0
EXIT_UNAVAILABLE = 2
EXIT_DEGRADED = 3


class ProbeUnavailable(RuntimeError):
    """The probe cannot run here: torch missing, CUDA missing, or no such device."""


@dataclass
class ProbeResult:
    """What one probe measured and how it compares with the spec of the detected model."""

    device: str
    device_name: str
    model: str | None
    torch_version: str
    matmul_size: int
    copy_mib: int
    fp32_tflops: float
    fp16_tflops: float | None
    bf16_tflops: float | None
    bandwidth_gbs: float
    spec: dict[str, float | None] | None
    ratios: dict[str, float]
    threshold: float
    comparison: str  # "ok" | "degraded" | "n/a"
    degraded: bool
    below: list[str] = field(default_factory=list)  # figures under threshold x spec
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ProbeUnavailable(
            "the GPU probe needs PyTorch, which is optional for the agent: "
            "pip install 'gpu-portal[probe]' (or a torch build matching the node's CUDA driver)"
        ) from exc
    return torch


def spec_figures(spec: GpuSpec) -> dict[str, float | None]:
    """The spec's figures under the same names as the measurements."""
    return {
        "fp32_tflops": spec.fp32_tflops,
        "fp16_tflops": spec.fp16_tensor_tflops,
        "bf16_tflops": spec.bf16_tensor_tflops,
        "bandwidth_gbs": spec.memory_bandwidth_gbs,
    }


def compare(
    measured: dict[str, float | None], spec: GpuSpec, threshold: float = DEFAULT_THRESHOLD
) -> tuple[dict[str, float], list[str]]:
    """(measured / spec for every figure both sides have, the names of those below `threshold`)."""
    ratios: dict[str, float] = {}
    for name, promised in spec_figures(spec).items():
        value = measured.get(name)
        if value is None or not promised:
            continue
        ratios[name] = round(value / promised, 3)
    below = sorted(name for name, ratio in ratios.items() if ratio < threshold)
    return ratios, below


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(torch: Any, device: Any, fn: Any, repeats: int, min_seconds: float) -> float:
    """Seconds per call of fn: warm-up, then a timed loop long enough to swamp launch and timer overhead."""
    for _ in range(2):
        fn()
    _sync(torch, device)
    start = time.perf_counter()
    fn()
    _sync(torch, device)
    one = max(time.perf_counter() - start, 1e-9)
    iterations = max(repeats, math.ceil(min_seconds / one))
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    _sync(torch, device)
    return (time.perf_counter() - start) / iterations


def _matmul_tflops(torch: Any, device: Any, dtype: Any, n: int, repeats: int, min_seconds: float) -> float:
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _timed(torch, device, lambda: torch.matmul(a, b, out=out), repeats, min_seconds)
    return 2.0 * n**3 / seconds / 1e12


def _copy_gbs(torch: Any, device: Any, mib: int, repeats: int, min_seconds: float) -> float:
    elements = mib * _MIB // 4
    src = torch.ones(elements, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _timed(torch, device, lambda: dst.copy_(src), repeats, min_seconds)
    return 2.0 * elements * 4 / seconds / 1e9  # read + write


def run_probe(
    device: str = "cuda:0",
    *,
    size: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    threshold: float = DEFAULT_THRESHOLD,
    copy_mib: int | None = None,
) -> ProbeResult:
    """Measure one device and compare with its spec. Raises ProbeUnavailable when it cannot run."""
    if not 0 < threshold <= 1.5:
        raise ValueError("threshold is a fraction of the spec figure, e.g. 0.5")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    torch = _import_torch()
    began = time.perf_counter()
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ProbeUnavailable(f"bad device {device!r}: {exc}") from exc
    notes: list[str] = []
    on_gpu = dev.type == "cuda"
    if on_gpu:
        if not torch.cuda.is_available():
            raise ProbeUnavailable("CUDA is not available to torch (CPU-only torch build, or no NVIDIA driver)")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ProbeUnavailable(f"{device}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(dev)
        device_name = props.name
        model: str | None = model_key_for(device_name, props.total_memory // _MIB)
        n = size or GPU_MATMUL_SIZE
        free_bytes, _total = torch.cuda.mem_get_info(dev)
        # Two copy buffers plus three matmul operands must fit beside whatever else runs on the GPU.
        mib = copy_mib or max(64, min(GPU_COPY_MIB, int(free_bytes // _MIB // 4)))
        min_seconds = _MIN_TIMED_S_GPU
        bf16 = props.major >= 8  # Volta and Turing have no bf16 tensor cores (torch would emulate: meaningless)
        fp16 = True
    elif dev.type == "cpu":
        device_name = platform.processor() or platform.machine() or "cpu"
        model = None
        n = size or CPU_MATMUL_SIZE
        mib = copy_mib or CPU_COPY_MIB
        min_seconds = 0.0
        bf16, fp16 = True, False  # fp16 matmul on CPU is slow emulation in many builds; skip it
        notes.append("CPU run: tiny sizes, a smoke test of the probe, not a measurement of a GPU")
    else:
        raise ProbeUnavailable(f"unsupported device type {dev.type!r}; use cuda:N or cpu")

    # Plain fp32 means no TF32: with TF32 on, the "fp32" figure would be a tensor-core figure (8x the spec).
    saved_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        fp32 = _matmul_tflops(torch, dev, torch.float32, n, repeats, min_seconds)
        fp16_tflops = _matmul_tflops(torch, dev, torch.float16, n, repeats, min_seconds) if fp16 else None
        bf16_tflops: float | None = None
        if bf16:
            try:
                bf16_tflops = _matmul_tflops(torch, dev, torch.bfloat16, n, repeats, min_seconds)
            except RuntimeError as exc:  # some CPU builds lack bf16 kernels
                notes.append(f"bf16 matmul not available: {exc}")
        bandwidth = _copy_gbs(torch, dev, mib, repeats, min_seconds)
    finally:
        torch.set_float32_matmul_precision(saved_precision)
        if on_gpu:
            torch.cuda.empty_cache()

    measured: dict[str, float | None] = {
        "fp32_tflops": fp32,
        "fp16_tflops": fp16_tflops,
        "bf16_tflops": bf16_tflops,
        "bandwidth_gbs": bandwidth,
    }
    spec = spec_for_key(model)
    ratios: dict[str, float] = {}
    below: list[str] = []
    if not on_gpu:
        comparison = "n/a"
    elif spec is None:
        comparison = "n/a"
        notes.append(f"no spec sheet for {device_name!r} (model key {model}); figures not compared")
    else:
        ratios, below = compare(measured, spec, threshold)
        comparison = "degraded" if below else "ok"
    return ProbeResult(
        device=str(dev),
        device_name=device_name,
        model=model,
        torch_version=str(torch.__version__),
        matmul_size=n,
        copy_mib=mib,
        fp32_tflops=round(fp32, 3),
        fp16_tflops=None if fp16_tflops is None else round(fp16_tflops, 3),
        bf16_tflops=None if bf16_tflops is None else round(bf16_tflops, 3),
        bandwidth_gbs=round(bandwidth, 1),
        spec=spec_figures(spec) if spec is not None and on_gpu else None,
        ratios=ratios,
        threshold=threshold,
        comparison=comparison,
        degraded=bool(below),
        below=below,
        notes=notes,
        duration_s=round(time.perf_counter() - began, 3),
    )


def format_result(result: ProbeResult) -> str:
    """A few readable lines for a terminal."""

    def fig(label: str, key: str, unit: str) -> str:
        value = getattr(result, key)
        if value is None:
            return f"  {label:<10} n/a"
        line = f"  {label:<10} {value:10.2f} {unit}"
        promised = (result.spec or {}).get(key)
        if promised:
            line += f"   spec {promised:8.1f}   ratio {result.ratios.get(key, float('nan')):.2f}"
        return line

    lines = [
        f"{result.device}: {result.device_name} (model {result.model or '?'}), torch {result.torch_version}",
        fig("fp32", "fp32_tflops", "TFLOPS"),
        fig("fp16", "fp16_tflops", "TFLOPS"),
        fig("bf16", "bf16_tflops", "TFLOPS"),
        fig("bandwidth", "bandwidth_gbs", "GB/s"),
        f"  verdict    {result.comparison}"
        + (f" (below {result.threshold:.0%} of spec: {', '.join(result.below)})" if result.degraded else ""),
    ]
    lines += [f"  note: {n}" for n in result.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure one GPU against its spec sheet.")
    parser.add_argument("--device", default="cuda:0", help="cuda:N or cpu (default cuda:0)")
    parser.add_argument("--size", type=int, default=None, help="matmul size n (default 8192 on GPU, 256 on CPU)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="minimum timed iterations")
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD, help="degraded below this fraction of spec"
    )
    parser.add_argument("--copy-mib", type=int, default=None, help="bandwidth buffer size in MiB")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = run_probe(
            args.device, size=args.size, repeats=args.repeats, threshold=args.threshold, copy_mib=args.copy_mib
        )
    except ProbeUnavailable as exc:
        print(f"probe unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_result(result))
    return EXIT_DEGRADED if result.degraded else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
