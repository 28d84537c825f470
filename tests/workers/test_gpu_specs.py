"""Spec sheet figures and NVML-name matching."""

from __future__ import annotations

import pytest

from workers.gpu.specs import SPECS, get_spec, model_key_for, spec_for_key


@pytest.mark.parametrize(
    ("name", "memory_mib", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", 81_920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81_920, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40_960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40_536, "A100-40GB"),
        ("A100-SXM4-80GB", 81_251, "A100-80GB"),  # old drivers: no "NVIDIA " prefix
        ("NVIDIA H100 80GB HBM3", 81_559, "H100-80GB"),
        ("NVIDIA H200", 143_771, "H200-141GB"),
        ("NVIDIA L40S", 46_068, "L40S-48GB"),
        ("Tesla V100-SXM2-32GB", 32_768, "V100-32GB"),
        ("Tesla V100-SXM2-16GB", 16_160, "V100-16GB"),
        ("Tesla V100-PCIE-16GB", 16_160, "V100-16GB"),
        ("NVIDIA RTX A6000", 49_140, "RTXA6000-48GB"),
        # Unknown models get a stable key from the name and memory, without vendor and form-factor words.
        ("NVIDIA L4", 23_034, "L4-22GB"),
        ("Tesla T4", 15_360, "T4-15GB"),
        ("NVIDIA GeForce RTX 4090", 24_564, "RTX4090-24GB"),
        ("NVIDIA A10", 23_028, "A10-22GB"),
    ],
)
def test_model_key_for_nvml_names(name: str, memory_mib: int, key: str) -> None:
    assert model_key_for(name, memory_mib) == key


def test_memory_decides_within_a_family_when_the_name_is_ambiguous() -> None:
    assert model_key_for("NVIDIA A100-SXM4", 40_960) == "A100-40GB"
    assert model_key_for("NVIDIA A100-SXM4", 81_920) == "A100-80GB"
    assert model_key_for("Tesla V100", 32_510) == "V100-32GB"


def test_issue_figures_and_data_sheet_figures() -> None:
    a100 = get_spec("A100-80GB")
    assert (a100.fp32_tflops, a100.fp16_tensor_tflops, a100.memory_bandwidth_gbs) == (19.5, 312.0, 2_039.0)
    h100 = get_spec("H100-80GB")
    assert (h100.fp32_tflops, h100.fp16_tensor_tflops, h100.memory_bandwidth_gbs) == (34.0, 756.0, 3_072.0)
    h200 = get_spec("H200-141GB")
    assert (h200.memory_bandwidth_gbs, h200.tdp_w, h200.fp16_tensor_tflops) == (4_800.0, 700, 989.5)
    assert get_spec("L40S-48GB").memory_bandwidth_gbs == 864.0
    assert get_spec("V100-32GB").bf16_tensor_tflops is None
    for spec in SPECS.values():
        assert spec.idle_w < spec.tdp_w
        assert spec.sm_clock_idle_mhz < spec.sm_clock_max_mhz
        assert spec.fp16_tensor_tflops > spec.fp32_tflops or spec.key.startswith("L40S")
        assert spec.nvml_names and all(model_key_for(n, spec.memory_mib) == spec.key for n in spec.nvml_names)


def test_lookup_errors() -> None:
    assert spec_for_key(None) is None and spec_for_key("L4-22GB") is None
    with pytest.raises(KeyError, match="known: A100-40GB"):
        get_spec("A100")
