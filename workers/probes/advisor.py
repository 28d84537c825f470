"""Batch-size and mixed-precision advisor: how large a batch fits this GPU, and what AMP buys.

Why: people pick batch sizes by folklore, run out of memory, or leave most of an 80 GB GPU empty. On the GPU it is
given, the advisor trains a small standard model built in code (a Transformer encoder: no download) at growing
batch sizes (1, 2, 4, ...) in fp32 and in AMP (bf16 where the GPU supports it, else fp16 with a GradScaler),
recording throughput (samples/s) and peak memory (`torch.cuda.max_memory_allocated`) until it runs out of memory
or reaches the limit, then names the batch size with the best throughput whose peak leaves `--margin` of the
memory free.

    python -m workers.probes.advisor [--device auto|cpu|cuda:0] [--max-batch 1024] [--margin 0.1] [--json]

On the CPU (tests, a smoke check) it runs tiny sizes; memory is then estimated from the tensors autograd keeps for
the backward pass plus the parameters, gradients and optimizer state (no CUDA allocator to ask), and marked so.
The last line of output is `ADVISOR_RESULT <json>`: the portal reads it from the job's log and plots it on the job
page. Exit status 0 when at least one batch ran, 2 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

RESULT_PREFIX = "ADVISOR_RESULT "


@dataclass
class Run:
    precision: str
    batch_size: int
    ok: bool
    samples_per_s: float | None = None
    peak_mib: float | None = None
    error: str = ""


@dataclass
class Report:
    device: str
    model: str
    amp_dtype: str
    limit_mib: float | None
    margin: float
    measured_memory: bool
    runs: list[Run] = field(default_factory=list)
    best: dict[str, Any] | None = None


def _model(torch: Any, d_model: int, layers: int, vocab: int) -> Any:
    nn = torch.nn
    module: Any = nn.Module

    class Encoder(module):  # type: ignore[misc]
        """Embedding, a Transformer encoder and a classifier head: a BERT-like model, small."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, 2)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    return Encoder()


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "out of memory" in text.lower() or type(exc).__name__ == "OutOfMemoryError"


def _one(torch: Any, device: Any, precision: str, amp_dtype: Any, batch: int, cfg: argparse.Namespace) -> Run:
    model = _model(torch, cfg.d_model, cfg.layers, cfg.vocab).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    use_amp = precision != "fp32"
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp and amp_dtype == torch.float16)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), device=device)
    labels = torch.randint(0, 2, (batch,), device=device)
    saved = [0]

    def pack(t: Any) -> Any:
        saved[0] += t.numel() * t.element_size()
        return t

    def step() -> None:
        with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            loss = torch.nn.functional.cross_entropy(model(tokens), labels)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    cuda = device.type == "cuda"
    try:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()  # warm-up (and the activation count on the CPU)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(cfg.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        if cuda:
            peak = torch.cuda.max_memory_allocated(device) / 2**20
        else:
            params = sum(p.numel() * p.element_size() for p in model.parameters())
            peak = (saved[0] + 4 * params) / 2**20  # weights, gradients, two AdamW moments, activations
        return Run(precision, batch, True, round(batch * cfg.steps / elapsed, 2), round(peak, 1))
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc):
            raise
        return Run(precision, batch, False, error="out of memory")
    finally:
        if cuda:
            torch.cuda.empty_cache()


def pick_best(runs: list[Run], limit_mib: float | None, margin: float) -> dict[str, Any] | None:
    """The run with the best throughput whose peak leaves `margin` of the limit free (any run when no limit)."""
    fits = [
        r
        for r in runs
        if r.ok and r.samples_per_s is not None and (limit_mib is None or (r.peak_mib or 0) <= (1 - margin) * limit_mib)
    ]
    if not fits:
        return None
    best = max(fits, key=lambda r: (r.samples_per_s or 0, -r.batch_size))
    return {"precision": best.precision, "batch_size": best.batch_size, "samples_per_s": best.samples_per_s,
            "peak_mib": best.peak_mib}  # fmt: skip


def advise(cfg: argparse.Namespace) -> Report:
    import torch

    name = cfg.device
    if name == "auto":
        name = "cuda:0" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    cuda = device.type == "cuda"
    bf16 = torch.cuda.is_bf16_supported() if cuda else True
    amp_dtype = torch.bfloat16 if bf16 else torch.float16
    limit = cfg.limit_mib
    if limit is None and cuda:
        limit = torch.cuda.get_device_properties(device).total_memory / 2**20
    report = Report(
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
        model=f"transformer-encoder d{cfg.d_model} x{cfg.layers} seq{cfg.seq_len}",
        amp_dtype="bf16" if amp_dtype == torch.bfloat16 else "fp16",
        limit_mib=round(limit, 1) if limit else None,
        margin=cfg.margin,
        measured_memory=cuda,
    )
    torch.manual_seed(0)
    for precision in ("fp32", report.amp_dtype):
        batch = 1
        while batch <= cfg.max_batch:
            run = _one(torch, device, precision, amp_dtype, batch, cfg)
            report.runs.append(run)
            if not run.ok or (limit and (run.peak_mib or 0) > limit):
                break
            batch *= 2
    report.best = pick_best(report.runs, report.limit_mib, cfg.margin)
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--limit-mib", type=float, default=None, help="memory limit (default: the GPU's)")
    parser.add_argument("--margin", type=float, default=0.1, help="share of the memory kept free")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--json", action="store_true", help="only the JSON result")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    report = advise(cfg)
    body = asdict(report)
    if not cfg.json:
        for r in report.runs:
            line = f"{r.precision:5} batch {r.batch_size:5}: "
            line += f"{r.samples_per_s} samples/s, peak {r.peak_mib} MiB" if r.ok else r.error
            print(line, flush=True)
        if report.best:
            b = report.best
            print(
                f"best: {b['precision']} batch {b['batch_size']} ({b['samples_per_s']} samples/s, {b['peak_mib']} MiB)"
            )
    print(RESULT_PREFIX + json.dumps(body, separators=(",", ":")), flush=True)
    return 0 if any(r.ok for r in report.runs) else 2


if __name__ == "__main__":
    sys.exit(main())
