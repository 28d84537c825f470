"""Memory and OOM guidance for a job, as plain functions of plain data: which kind of failure it was, and advice
computed from its telemetry, each item with the number behind it.

OOM kinds (told apart because their fixes differ):
- `container_oom`: the kernel's OOM killer ended the container (the runtime reports reason `oom`; or exit 137 with
  the kernel's words in the message): host memory, fixed by `memory_mib`, not by anything on the GPU;
- `cuda_oom`: the framework ran out of GPU memory (PyTorch `OutOfMemoryError` / "CUDA out of memory",
  `CUBLAS_STATUS_ALLOC_FAILED`, TensorFlow `ResourceExhausted`/"OOM when allocating" in the log);
- `nccl`: the collective library failed or timed out (NCCL errors, the watchdog's collective timeout).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|ResourceExhausted(Error)?|OOM when allocating"
    r"|cudaErrorMemoryAllocation|out of memory on device",
)
NCCL = re.compile(
    r"NCCL (error|WARN|timeout)|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"
    r"|Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout"
)
KERNEL_OOM = re.compile(r"oom|out of memory|memory limit", re.IGNORECASE)

# NVIDIA's MIG GPU-instance profiles per GPU model (name, memory in GB as NVIDIA names them), smallest first.
MIG_PROFILES: dict[str, list[tuple[str, int]]] = {
    "A100-80GB": [("1g.10gb", 10), ("1g.20gb", 20), ("2g.20gb", 20), ("3g.40gb", 40), ("4g.40gb", 40), ("7g.80gb", 80)],
    "H100-80GB": [("1g.10gb", 10), ("1g.20gb", 20), ("2g.20gb", 20), ("3g.40gb", 40), ("4g.40gb", 40), ("7g.80gb", 80)],
    "A100-40GB": [("1g.5gb", 5), ("2g.10gb", 10), ("3g.20gb", 20), ("4g.20gb", 20), ("7g.40gb", 40)],
    "H200-141GB": [
        ("1g.18gb", 18),
        ("1g.35gb", 35),
        ("2g.35gb", 35),
        ("3g.71gb", 71),
        ("4g.71gb", 71),
        ("7g.141gb", 141),
    ],
}
# A MIG instance's usable memory is a little under its name's GB; the headroom asked above the peak.
MIG_USABLE = 0.95
HEADROOM = 1.2
NEAR_FULL = 0.9  # peak above this share of the GPU: close to an OOM
FAR_BELOW = 0.4  # peak with headroom under this share: a smaller GPU or a MIG instance would do
INPUT_BOUND_UTIL = 40.0  # mean utilization below this while memory is held: waiting for input
USED_UTIL = 5.0


@dataclass(frozen=True)
class GpuUse:
    """One GPU's use over a job's life, from the minute rollups."""

    util_mean: float | None
    mem_peak_mib: int | None
    mem_total_mib: int


@dataclass(frozen=True)
class Advice:
    code: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}


def failure_kind(*, exit_code: int | None, reason: str, message: str, log_lines: Iterable[str]) -> str | None:
    """container_oom, cuda_oom, nccl or None (the log is read newest first: the error that ended it is last)."""
    if reason == "oom" or (exit_code == 137 and KERNEL_OOM.search(message or "")):
        return "container_oom"
    for line in log_lines:
        if CUDA_OOM.search(line):
            return "cuda_oom"
        if NCCL.search(line):
            return "nccl"
    return None


def smallest_mig(model: str, need_mib: float) -> tuple[str, int] | None:
    """The smallest MIG profile of `model` (or of any model, when it has none) that holds `need_mib`."""
    tables = [MIG_PROFILES[model]] if model in MIG_PROFILES else list(MIG_PROFILES.values())
    fits = [(gb, name) for table in tables for name, gb in table if gb * 1024 * MIG_USABLE >= need_mib]
    if not fits:
        return None
    gb, name = min(fits)
    return name, gb


def _pct(part: float, whole: float) -> int:
    return round(100 * part / whole) if whole else 0


def advise(
    *,
    gpus: Sequence[GpuUse],
    gpu_count: int,
    model: str,
    failure: str | None,
    memory_mib: int,
    part: str = "",
    shared: bool = False,
) -> list[Advice]:
    """Advice from the job's GPU use and its failure kind, each item with its number. `part` names the MIG instance
    or share the job ran on ("1g.10gb instance", "1/4 share"): memory is then judged against the part's, and
    utilization, which is the whole GPU's, is not the job's own to judge. `shared`: the part is a share of a GPU
    without memory isolation, where going over the budget takes memory from the jobs beside it."""
    out: list[Advice] = []
    peaks = [g.mem_peak_mib for g in gpus if g.mem_peak_mib is not None]
    peak = max(peaks) if peaks else None
    total = max((g.mem_total_mib for g in gpus), default=0)
    if failure == "container_oom":
        out.append(
            Advice(
                "container_oom",
                f"The kernel killed the container for host memory (exit 137) at its limit of {memory_mib} MiB: ask for "
                f"more memory (memory_mib {memory_mib * 2}) or hold less data in RAM; GPU memory was not the cause.",
            )
        )
    if failure == "cuda_oom":
        at = f" (peak {peak} of {total} MiB, {_pct(peak, total)}%)" if peak is not None and total else ""
        out.append(
            Advice(
                "cuda_oom",
                f"The GPU ran out of memory{at}: a smaller batch, gradient checkpointing, or AMP; or a GPU with more "
                "memory.",
            )
        )
    if failure == "nccl":
        out.append(
            Advice(
                "nccl",
                "NCCL failed or timed out between GPUs: check that every rank started (NCCL_DEBUG=INFO), the network "
                "interface (NCCL_SOCKET_IFNAME), and that no rank ran out of memory first.",
            )
        )
    if shared and peak is not None and total and peak > total:
        out.append(
            Advice(
                "over_share",
                f"Peak GPU memory {peak} MiB is above the share's budget of {total} MiB ({_pct(peak, total)}%): a "
                "shared GPU has no memory isolation, so the jobs beside it may run out of memory. Keep the job within "
                "its budget (it is told it in GPUPORTAL_GPU_MEMORY_MIB; torch.cuda.set_per_process_memory_fraction "
                "holds PyTorch to it), or ask for a bigger share or a MIG instance.",
            )
        )
    if peak is not None and total:
        share = peak / total
        if failure == "cuda_oom" or share >= NEAR_FULL:
            out.append(
                Advice(
                    "amp",
                    f"Peak GPU memory {peak} MiB is {_pct(peak, total)}% of {total} MiB: mixed precision "
                    "(torch.autocast with bf16, or fp16 with a GradScaler) roughly halves activation memory.",
                )
            )
        elif failure is None and peak * HEADROOM <= FAR_BELOW * total:
            need = peak * HEADROOM
            mig = smallest_mig(model, need)
            fits_mig = Advice(
                "use_mig_profile",
                f"Peak {peak} MiB with 20% headroom ({round(need)} MiB) fits a MIG {mig[0]} instance ({mig[1]} GB).",
            ) if mig is not None else None  # fmt: skip
            if part and not shared:
                # Already on a MIG instance: only a strictly smaller profile is worth saying.
                if fits_mig is not None and mig is not None and mig[1] * 1024 * MIG_USABLE < total:
                    out.append(fits_mig)
            else:
                out.append(
                    Advice(
                        "smaller_gpu",
                        f"Peak GPU memory {peak} MiB is {_pct(peak, total)}% of "
                        f"{f'its {part}' if part else f'the {model}'}'s {total} MiB: a GPU with "
                        f"{round(need / 1024)} GB or more would do.",
                    )
                )
                if fits_mig is not None:
                    out.append(fits_mig)
        # Judged on the GPUs that hold memory: an unused GPU beside them is "fewer_gpus", not a slow input.
        holding = [g for g in gpus if g.util_mean is not None and (g.mem_peak_mib or 0) >= 0.25 * g.mem_total_mib]
        held_util = sum(g.util_mean or 0 for g in holding) / len(holding) if holding else None
        if held_util is not None and held_util < INPUT_BOUND_UTIL and failure is None and not part:
            out.append(
                Advice(
                    "input_bound",
                    f"Mean GPU utilization {held_util:.0f}% while {peak} MiB is held: the GPU waits for input; more "
                    "data-loader workers (num_workers), pin_memory=True, prefetching.",
                )
            )
    if gpu_count > 1 and len(gpus) == gpu_count:  # every GPU has telemetry: an unseen one is not unused
        used = [g for g in gpus if (g.util_mean or 0) >= USED_UTIL]
        if len(used) < gpu_count:
            k = max(len(used), 1)
            out.append(
                Advice(
                    "fewer_gpus",
                    f"Asked for {gpu_count} GPUs, used {len(used)} (at {USED_UTIL:.0f}% utilization or more): ask for "
                    f"{k}.",
                )
            )
    return out
