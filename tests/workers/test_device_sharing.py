"""The read-only MIG part of bench/device_sharing.py against the fake driver: the profiles an A100-80GB offers, named
and checked against the portal's table (the `+me` variant NVML also lists is left aside), and a board without MIG."""

from __future__ import annotations

import pynvml
import pytest

from bench.device_sharing import check_mig, name_profiles
from tests.workers.fake_nvml import FakeGpu, FakeNvml

# What an A100-SXM4-80GB answers (nvidia-smi mig -lgip): id -> (name, slices, instances, memory MB).
A100_80GB = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: ("1g.10gb", 1, 7, 9_728),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: ("1g.10gb+me", 1, 1, 9_728),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: ("1g.20gb", 1, 4, 19_968),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: ("2g.20gb", 2, 3, 19_968),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: ("3g.40gb", 3, 2, 40_192),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: ("4g.40gb", 4, 1, 40_192),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: ("7g.80gb", 7, 1, 80_896),
}


def test_mig_profiles_are_read_and_checked_against_the_portals_table(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        FakeGpu(uuid="GPU-a", name="NVIDIA A100-SXM4-80GB", gi_profiles=dict(A100_80GB)),
        FakeGpu(uuid="GPU-b", name="NVIDIA L40S", memory_total_mib=46_068),
    ]
    FakeNvml(gpus).install(monkeypatch)
    a100, l40s = check_mig()
    assert a100["mig_mode"] == {"current": 0, "pending": 0}
    assert [p["name"] for p in a100["profiles"]] == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
    ]  # fmt: skip
    name_profiles(a100, "A100-80GB")
    assert a100["portal_table_matches"] and a100["portal_profiles_missing"] == []
    assert [p["name"] for p in a100["profiles"] if not p["in_portal_table"]] == ["1g.10gb+me"]
    name_profiles(a100, "A100-40GB")  # the wrong model: none of its profiles is offered
    assert not a100["portal_table_matches"] and "1g.5gb" in a100["portal_profiles_missing"]
    assert l40s["profiles"] == []
    name_profiles(l40s, "L40S")
    assert l40s["portal_table_matches"] is False and l40s["portal_profiles_missing"] == []
