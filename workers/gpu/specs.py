"""Spec sheets of the GPU models the portal knows, and matching of NVML names to model keys.

Figures are NVIDIA data-sheet values (dense, i.e. without 2:4 sparsity) for the SXM variant of each model unless
a comment says otherwise. Idle power and clocks are not data-sheet figures: they are typical `nvidia-smi` readings
of an idle board in P0/P8 and only feed the simulated backend.

The probe (`workers.probes.torch_probe`) compares its measurements against these numbers, and the simulated backend
draws its GPUs from them, so a model key here is the vocabulary shared by agent, portal and tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: what the data sheet promises."""

    key: str
    marketing_name: str
    memory_mib: int
    tdp_w: int
    idle_w: int
    fp32_tflops: float
    fp16_tensor_tflops: float
    bf16_tensor_tflops: float | None  # None: no bf16 tensor cores (Volta)
    memory_bandwidth_gbs: float
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    nvml_names: tuple[str, ...]
    notes: str = ""
    gpm: bool = False  # GPU Performance Monitoring (Hopper and later): SM activity per MIG instance, tensor activity


_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec(
        key="A100-40GB",
        marketing_name="NVIDIA A100 40GB",
        memory_mib=40_960,
        tdp_w=400,
        idle_w=52,
        fp32_tflops=19.5,
        fp16_tensor_tflops=312.0,
        bf16_tensor_tflops=312.0,
        memory_bandwidth_gbs=1_555.0,
        sm_clock_max_mhz=1_410,
        sm_clock_idle_mhz=210,
        nvml_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
        notes="PCIe variant: 250 W TDP, same compute and bandwidth.",
    ),
    GpuSpec(
        key="A100-80GB",
        marketing_name="NVIDIA A100 80GB",
        memory_mib=81_920,
        tdp_w=400,
        idle_w=60,
        fp32_tflops=19.5,
        fp16_tensor_tflops=312.0,
        bf16_tensor_tflops=312.0,
        memory_bandwidth_gbs=2_039.0,
        sm_clock_max_mhz=1_410,
        sm_clock_idle_mhz=210,
        nvml_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
        notes="PCIe variant: 300 W TDP, 1,935 GB/s.",
    ),
    GpuSpec(
        key="H100-80GB",
        marketing_name="NVIDIA H100 80GB (SXM5)",
        memory_mib=81_559,
        tdp_w=700,
        idle_w=72,
        # The project's issue fixes these three figures; NVIDIA's SXM5 data sheet says 67 TFLOPS fp32,
        # 989 fp16/bf16 dense and 3,350 GB/s (34 is its fp64 figure, 756 the PCIe card's fp16). Lower spec
        # figures only make the probe's "degraded" verdict more lenient, never a false alarm.
        fp32_tflops=34.0,
        fp16_tensor_tflops=756.0,
        bf16_tensor_tflops=756.0,
        memory_bandwidth_gbs=3_072.0,
        sm_clock_max_mhz=1_980,
        sm_clock_idle_mhz=345,
        nvml_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100"),
        notes="Figures per the project issue (see comment in specs.py); PCIe variant 350 W, 2,000 GB/s.",
        gpm=True,
    ),
    GpuSpec(
        key="H200-141GB",
        marketing_name="NVIDIA H200 (SXM)",
        memory_mib=143_771,
        tdp_w=700,
        idle_w=80,
        fp32_tflops=67.0,
        fp16_tensor_tflops=989.5,
        bf16_tensor_tflops=989.5,
        memory_bandwidth_gbs=4_800.0,
        sm_clock_max_mhz=1_980,
        sm_clock_idle_mhz=345,
        nvml_names=("NVIDIA H200", "NVIDIA H200 NVL"),
        notes="H200 NVL (PCIe): 600 W TDP, 60 TFLOPS fp32, 835 fp16 dense.",
        gpm=True,
    ),
    GpuSpec(
        key="L40S-48GB",
        marketing_name="NVIDIA L40S",
        memory_mib=46_068,
        tdp_w=350,
        idle_w=35,
        fp32_tflops=91.6,
        fp16_tensor_tflops=362.05,
        bf16_tensor_tflops=362.05,
        memory_bandwidth_gbs=864.0,
        sm_clock_max_mhz=2_520,
        sm_clock_idle_mhz=210,
        nvml_names=("NVIDIA L40S",),
        notes="48 GB GDDR6 with ECC on; NVML reports 46,068 MiB.",
    ),
    GpuSpec(
        key="V100-32GB",
        marketing_name="NVIDIA Tesla V100 32GB (SXM2)",
        memory_mib=32_768,
        tdp_w=300,
        idle_w=40,
        fp32_tflops=15.7,
        fp16_tensor_tflops=125.0,
        bf16_tensor_tflops=None,
        memory_bandwidth_gbs=900.0,
        sm_clock_max_mhz=1_530,
        sm_clock_idle_mhz=135,
        nvml_names=("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB", "Tesla V100-SXM3-32GB"),
        notes="PCIe variant: 250 W, 14 TFLOPS fp32, 112 fp16 tensor.",
    ),
    GpuSpec(
        key="V100-16GB",
        marketing_name="NVIDIA Tesla V100 16GB (SXM2)",
        memory_mib=16_384,
        tdp_w=300,
        idle_w=38,
        fp32_tflops=15.7,
        fp16_tensor_tflops=125.0,
        bf16_tensor_tflops=None,
        memory_bandwidth_gbs=900.0,
        sm_clock_max_mhz=1_530,
        sm_clock_idle_mhz=135,
        nvml_names=("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
        notes="PCIe variant: 250 W, 14 TFLOPS fp32, 112 fp16 tensor.",
    ),
    GpuSpec(
        key="RTXA6000-48GB",
        marketing_name="NVIDIA RTX A6000",
        memory_mib=49_140,
        tdp_w=300,
        idle_w=22,
        fp32_tflops=38.7,
        fp16_tensor_tflops=154.8,
        bf16_tensor_tflops=154.8,
        memory_bandwidth_gbs=768.0,
        sm_clock_max_mhz=1_800,
        sm_clock_idle_mhz=210,
        nvml_names=("NVIDIA RTX A6000",),
    ),
)

SPECS: dict[str, GpuSpec] = {s.key: s for s in _SPECS}

# Exact NVML names first (fast, unambiguous); the fuzzy family match below covers names we have not listed,
# e.g. an "A100-SXM4-80GB" reported by an old driver without the "NVIDIA " prefix.
_BY_NVML_NAME: dict[str, GpuSpec] = {n.lower(): s for s in _SPECS for n in s.nvml_names}
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("h200", ("H200-141GB",)),
    ("h100", ("H100-80GB",)),
    ("a100", ("A100-40GB", "A100-80GB")),
    ("l40s", ("L40S-48GB",)),
    ("v100", ("V100-16GB", "V100-32GB")),
    ("a6000", ("RTXA6000-48GB",)),
)


def get_spec(key: str) -> GpuSpec:
    """The spec for a model key; KeyError names the known keys so a typo in a config is obvious."""
    try:
        return SPECS[key]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(sorted(SPECS))}") from None


def spec_for_key(key: str | None) -> GpuSpec | None:
    """The spec for a model key, or None for models without a spec sheet here."""
    return SPECS.get(key) if key else None


def _nearest_by_memory(candidates: tuple[str, ...], memory_mib: int) -> GpuSpec:
    # NVML's total is a little under the nominal size (ECC, reserved regions): pick the nearest, not an exact match.
    return min((SPECS[k] for k in candidates), key=lambda s: abs(s.memory_mib - memory_mib))


def model_key_for(name: str, memory_mib: int) -> str:
    """Model key ("A100-80GB") for an NVML device name and total memory.

    Known models map to their spec key; memory decides between sizes of one family (A100 40/80 GB, V100 16/32 GB),
    because some drivers report the same name for both. Unknown models get a stable key derived from the name and
    the memory rounded to GB ("NVIDIA L4", 23034 MiB -> "L4-22GB"), so the portal can still group them.
    """
    exact = _BY_NVML_NAME.get(name.strip().lower())
    lowered = name.lower()
    for token, keys in _FAMILIES:
        if token in lowered:
            if exact is not None and len(keys) == 1:
                return exact.key
            return _nearest_by_memory(keys, memory_mib).key
    if exact is not None:
        return exact.key
    # Vendor words, form factors and memory sizes vary between drivers for one board: leave them out of the key.
    words = re.split(r"[\s\-_]+", name.strip())
    kept = [w for w in words if w and not _NOISE_WORD.fullmatch(w)]
    base = re.sub(r"[^A-Za-z0-9]+", "", "".join(kept)).upper() or "GPU"
    return f"{base}-{round(memory_mib / 1024)}GB"


_NOISE_WORD = re.compile(r"(?i)nvidia|tesla|geforce|quadro|pcie|sxm\d?|nvl|hbm\d?e?|\d+gb")
