"""OOM kinds told apart and advice computed from the numbers (no database)."""

from __future__ import annotations

import pytest

from apps.efficiency.advice import GpuUse, advise, failure_kind, smallest_mig


@pytest.mark.parametrize(
    ("exit_code", "reason", "message", "lines", "kind"),
    [
        (137, "oom", "", [], "container_oom"),
        (137, "exit_code", "killed by the kernel OOM killer (memory limit 16384 MiB)", [], "container_oom"),
        (137, "exit_code", "killed", [], None),  # SIGKILL alone is not an OOM
        (1, "exit_code", "", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], "cuda_oom"),
        (
            1,
            "exit_code",
            "",
            ["RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"],
            "cuda_oom",
        ),
        (
            1,
            "exit_code",
            "",
            ["tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating"],
            "cuda_oom",
        ),
        (1, "exit_code", "", ["[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12)"], "nccl"),
        (1, "exit_code", "", ["torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970"], "nccl"),
        (3, "exit_code", "", ["ERROR: giving up"], None),
    ],
)
def test_failure_kinds(exit_code, reason, message, lines, kind) -> None:
    assert failure_kind(exit_code=exit_code, reason=reason, message=message, log_lines=lines) == kind


def codes(items) -> list[str]:
    return [a.code for a in items]


def test_cuda_oom_near_capacity_advises_amp_with_the_peak() -> None:
    items = advise(
        gpus=[GpuUse(util_mean=90, mem_peak_mib=81000, mem_total_mib=81920)],
        gpu_count=1,
        model="H100-80GB",
        failure="cuda_oom",
        memory_mib=16384,
    )
    assert codes(items) == ["cuda_oom", "amp"]
    assert "81000 of 81920 MiB, 99%" in items[0].detail and "99% of 81920 MiB" in items[1].detail


def test_container_oom_points_at_host_memory_not_the_gpu() -> None:
    items = advise(gpus=[], gpu_count=1, model="A100-80GB", failure="container_oom", memory_mib=16384)
    assert codes(items) == ["container_oom"] and "16384 MiB" in items[0].detail and "32768" in items[0].detail


def test_small_peak_names_a_smaller_gpu_and_a_mig_profile_that_fits() -> None:
    items = advise(
        gpus=[GpuUse(util_mean=80, mem_peak_mib=7000, mem_total_mib=81920)],
        gpu_count=1,
        model="A100-80GB",
        failure=None,
        memory_mib=16384,
    )
    assert codes(items) == ["smaller_gpu", "use_mig_profile"]
    assert "7000 MiB is 9%" in items[0].detail
    assert "MIG 1g.10gb" in items[1].detail and "8400 MiB" in items[1].detail
    assert smallest_mig("A100-80GB", 12000) == ("1g.20gb", 20)
    assert smallest_mig("H200-141GB", 30000) == ("1g.35gb", 35)
    assert smallest_mig("A100-80GB", 200000) is None


def test_low_utilization_with_memory_held_is_input_bound() -> None:
    items = advise(
        gpus=[GpuUse(util_mean=22, mem_peak_mib=40000, mem_total_mib=81920)],
        gpu_count=1,
        model="A100-80GB",
        failure=None,
        memory_mib=16384,
    )
    assert codes(items) == ["input_bound"] and "22%" in items[0].detail


def test_asked_for_four_used_one() -> None:
    idle = GpuUse(util_mean=0, mem_peak_mib=300, mem_total_mib=81920)
    busy = GpuUse(util_mean=95, mem_peak_mib=60000, mem_total_mib=81920)
    items = advise(gpus=[busy, idle, idle, idle], gpu_count=4, model="A100-80GB", failure=None, memory_mib=16384)
    assert codes(items) == ["fewer_gpus"] and "Asked for 4 GPUs, used 1" in items[0].detail
