"""MIG discovery: NVML's MIG calls against a stand-in for `pynvml` (real call shapes, constants and NVMLError
subclasses), the simulated backend's layouts from NVIDIA's profile tables, and the portal following a node's
layout through registration (instances created, changed, retired)."""

from __future__ import annotations

import ctypes
import inspect
from fractions import Fraction
from typing import Any

import pynvml
import pytest

from apps.fleet import services
from apps.fleet.messages import check_registration
from apps.fleet.models import Gpu
from tests.factories import NodeFactory
from workers.gpu.base import GpuInfo
from workers.gpu.mig import (
    MIG_PROFILES,
    gpu_instance_profile,
    is_profile_name,
    layout_fits,
    profile_fraction,
    split_model_spec,
)
from workers.gpu.nvml_mig import discover_mig_devices, mig_enabled
from workers.gpu.simulated import SimulatedBackend

MIB = 1024 * 1024


class StandInNvml:
    """The pynvml functions discovery calls, over a table of MIG slots (None: empty slot). Constants and
    NVMLError come from the real module, so `NVMLError(code)` is the real subclass (NVMLError_NotFound...)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, slots: list[tuple[str, str, int, int] | int | None], *, mig: bool = True) -> None:
        self.slots = slots  # (uuid, name, memory MiB, gi id), None for an empty slot, or an NVML error code
        self.mig = mig
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        self.calls.append("mode")
        if self.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE if self.mig else pynvml.NVML_DEVICE_MIG_DISABLE] * 2

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return len(self.slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        slot = self.slots[index]
        if slot is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if isinstance(slot, int):
            raise pynvml.NVMLError(slot)
        return ("mig", index)

    def _slot(self, handle: Any) -> tuple[str, str, int, int]:
        slot = self.slots[handle[1]]
        assert isinstance(slot, tuple)
        return slot

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._slot(handle)[0]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._slot(handle)[1]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        mem = pynvml.c_nvmlMemory_t()
        mem.total = ctypes.c_ulonglong(self._slot(handle)[2] * MIB)
        return mem

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._slot(device)[3]

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        """Slice counts from the table's name when it is one NVIDIA gives ("1c.3g.40gb"), as the driver reports."""
        name = self._slot(device)[1].rsplit(" ", 1)[-1]
        ci, _, gi = name.rpartition("c.") if "c." in name else ("", "", name)
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.gpuInstanceSliceCount = int(gi.split("g.")[0]) if "g." in gi else 1
        attrs.computeInstanceSliceCount = int(ci) if ci else attrs.gpuInstanceSliceCount
        return attrs


def test_the_stand_in_has_pynvmls_call_shapes():
    for name, fake in inspect.getmembers(StandInNvml, inspect.isfunction):
        if name.startswith("nvml"):
            real = [p for p in inspect.signature(getattr(pynvml, name)).parameters]
            assert [p for p in inspect.signature(fake).parameters][1:] == real, name
    assert type(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)).__name__ == "NVMLError_NotFound"


def test_discovery_walks_the_slots_and_skips_empty_ones():
    nv = StandInNvml(
        [
            ("MIG-aaaa", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40_192, 1),
            None,
            pynvml.NVML_ERROR_INVALID_ARGUMENT,
            ("MIG-bbbb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9_728, 9),
            None,
        ]
    )
    found = discover_mig_devices(nv, handle=object())
    assert [(d.uuid, d.profile, d.memory_mib, d.gi_id) for d in found] == [
        ("MIG-aaaa", "3g.40gb", 40_192, 1),
        ("MIG-bbbb", "1g.10gb", 9_728, 9),
    ]


def test_compute_instances_are_devices_of_their_own_priced_by_their_slices():
    """A 3g.40gb GPU instance split into compute instances of 1 and 2 slices: two MIG devices sharing its memory,
    named as NVIDIA names them, each billed at its own slices (not twice the GPU instance's 3/7)."""
    nv = StandInNvml(
        [
            ("MIG-c1", "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", 40_192, 2),
            ("MIG-c2", "NVIDIA A100-SXM4-80GB MIG 2c.3g.40gb", 40_192, 2),
            ("MIG-me", "NVIDIA A100-SXM4-80GB MIG 1g.10gb+me", 9_728, 9),
        ]
    )
    found = discover_mig_devices(nv, handle=object())
    assert [(d.uuid, d.profile, d.gi_id) for d in found] == [
        ("MIG-c1", "1c.3g.40gb", 2),
        ("MIG-c2", "2c.3g.40gb", 2),
        ("MIG-me", "1g.10gb", 9),
    ]
    assert [profile_fraction(d.profile) for d in found] == [Fraction(1, 7), Fraction(2, 7), Fraction(1, 7)]
    assert gpu_instance_profile("1c.3g.40gb") == "3g.40gb" and gpu_instance_profile("1g.10gb") == "1g.10gb"
    assert is_profile_name("1c.3g.40gb") and is_profile_name("2c.3g.20gb") and is_profile_name("1g.10gb")
    for bad in ("3c.3g.40gb", "0c.3g.40gb", "1c.3g.41gb", "1c.1g.10gb", "1c1g.10gb", "8g.80gb"):
        assert not is_profile_name(bad), bad
    for bad in ("3c.3g.40gb", "0c.2g.20gb", "1c.8g.80gb"):
        with pytest.raises(ValueError):
            profile_fraction(bad)


def test_a_driver_naming_instances_otherwise_falls_back_to_the_slice_counts():
    # Names without "MIG <profile>" (the stand-in's attributes take the slice counts from the last word): the
    # profile is built from the attributes' slice counts and the memory.
    nv = StandInNvml([("MIG-a", "instance 3g.40gb", 40_192, 1), ("MIG-b", "instance 1c.2g.20gb", 19_968, 5)])
    assert [d.profile for d in discover_mig_devices(nv, handle=object())] == ["3g.40gb", "1c.2g.20gb"]


def test_other_nvml_errors_are_not_swallowed():
    nv = StandInNvml([pynvml.NVML_ERROR_GPU_IS_LOST])
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        discover_mig_devices(nv, handle=object())


def test_mig_mode():
    assert mig_enabled(StandInNvml([], mig=True), object()) is True
    assert mig_enabled(StandInNvml([], mig=False), object()) is False
    assert mig_enabled(StandInNvml([], mig=None), object()) is False  # type: ignore[arg-type]


def test_profile_tables_are_nvidias():
    assert {m: sorted(t) for m, t in MIG_PROFILES.items()} == {
        "A100-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "H100-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "A100-40GB": ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        "H200-141GB": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    }
    counts = {p.name: p.max_count for p in MIG_PROFILES["H200-141GB"].values()}
    assert counts == {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1}
    assert profile_fraction("1g.10gb") * 7 == 1
    assert layout_fits("A100-80GB", ["3g.40gb", "4g.40gb"])
    assert layout_fits("A100-80GB", ["1g.10gb"] * 7)
    assert not layout_fits("A100-80GB", ["1g.10gb"] * 8)
    assert not layout_fits("A100-80GB", ["1g.20gb"] * 5)
    assert not layout_fits("L40S-48GB", ["1g.10gb"])
    with pytest.raises(ValueError):
        split_model_spec("A100-40GB:mig=1g.10gb")


def test_simulated_backend_reports_its_layout():
    sim = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*3+2g.20gb*2", "H100-80GB"], seed=1)
    mig, whole = sim.discover()
    assert mig.mig_mode and not whole.mig_mode and whole.mig_devices == ()
    assert sorted(d.profile for d in mig.mig_devices) == ["1g.10gb"] * 3 + ["2g.20gb"] * 2
    assert all(d.uuid.startswith("MIG-") for d in mig.mig_devices)
    assert {d.memory_mib for d in mig.mig_devices} == {9_728, 19_968}
    assert GpuInfo.to_dict(mig)["mig_devices"][0]["uuid"] == mig.mig_devices[0].uuid
    # Deterministic: the same seed gives the same instance uuids.
    again = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*3+2g.20gb*2", "H100-80GB"], seed=1).discover()[0]
    assert again.mig_devices == mig.mig_devices


def _registration(node: str, gpus: list[GpuInfo]) -> Any:
    payload = {"node": node, "token": "x", "ts": None, "gpus": [g.to_dict() for g in gpus], "backend": "simulated"}
    return check_registration(payload)


def _live_instances(parent_uuid: str) -> list[tuple[str, int]]:
    rows = Gpu.devices.filter(parent__uuid=parent_uuid, kind="mig", retired_at__isnull=True).order_by("index")
    return [(g.mig_profile, g.memory_mib) for g in rows]


@pytest.mark.django_db
def test_the_portal_follows_the_layout_through_registration():
    node = NodeFactory(name="n1")
    first = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*7", "A100-80GB"]).discover()
    services.node_register(node_id=node.pk, gpus=_registration("n1", first).gpus)
    parent = first[0].uuid
    assert _live_instances(parent) == [("1g.10gb", 9_728)] * 7
    assert Gpu.objects.get(uuid=parent).mig_mode
    assert Gpu.objects.count() == 2  # instances are not physical GPUs
    # Same report again: nothing changes (same rows).
    ids = set(Gpu.devices.filter(parent__uuid=parent, retired_at__isnull=True).values_list("pk", flat=True))
    services.node_register(node_id=node.pk, gpus=_registration("n1", first).gpus)
    assert set(Gpu.devices.filter(parent__uuid=parent, retired_at__isnull=True).values_list("pk", flat=True)) == ids
    # An admin repartitions with mig-parted: the portal takes the new layout.
    second = SimulatedBackend("n1", ["A100-80GB:mig=3g.40gb+4g.40gb", "A100-80GB"]).discover()
    services.node_register(node_id=node.pk, gpus=_registration("n1", second).gpus)
    assert sorted(_live_instances(parent)) == [("3g.40gb", 40_192), ("4g.40gb", 40_192)]
    assert Gpu.devices.filter(parent__uuid=parent, retired_at__isnull=False).count() == 7
    # MIG mode off: every instance retired, the GPU whole again.
    third = SimulatedBackend("n1", ["A100-80GB", "A100-80GB"]).discover()
    services.node_register(node_id=node.pk, gpus=_registration("n1", third).gpus)
    assert _live_instances(parent) == []
    assert not Gpu.objects.get(uuid=parent).mig_mode


def test_registration_refuses_bad_instances():
    from apps.fleet.messages import MessageRejected

    gpu = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*7"]).discover()[0].to_dict()
    for bad in ({"uuid": "GPU-x", "profile": "1g.10gb", "memory_mib": 1, "gi_id": 1},
                {"uuid": "MIG-x", "profile": "big", "memory_mib": 1, "gi_id": 1}):  # fmt: skip
        payload = {"node": "n1", "token": "x", "gpus": [{**gpu, "mig_devices": [bad]}]}
        with pytest.raises(MessageRejected):
            check_registration(payload)
    payload = {"node": "n1", "token": "x", "gpus": [{**gpu, "mig_devices": gpu["mig_devices"] * 2}]}
    with pytest.raises(MessageRejected):
        check_registration(payload)
    # Compute instances are named as NVIDIA names them, and an agent may report them.
    ci = [{"uuid": f"MIG-c{c}", "profile": f"{c}c.3g.40gb", "memory_mib": 40_192, "gi_id": 2} for c in (1, 2)]
    checked = check_registration({"node": "n1", "token": "x", "gpus": [{**gpu, "mig_devices": ci}]})
    assert [d.profile for d in checked.gpus[0].mig_devices] == ["1c.3g.40gb", "2c.3g.40gb"]


@pytest.mark.django_db
def test_gpu_shares_command(sharing_fleet):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("gpu_shares", "GPU-shared-1", "2", stdout=out)
    assert "2 share(s)" in out.getvalue()
    assert Gpu.objects.get(uuid="GPU-shared-1").shares == 2
    with pytest.raises(CommandError):
        call_command("gpu_shares", "GPU-mig-0", "4")


def test_simulated_jobs_on_mig_instances_use_their_instances_memory():
    sim = SimulatedBackend("n1", ["A100-80GB:mig=3g.40gb+1g.10gb*4", "A100-80GB"], seed=3)
    mig, _ = sim.discover()
    big = next(d for d in mig.mig_devices if d.profile == "3g.40gb")
    small = next(d for d in mig.mig_devices if d.profile == "1g.10gb")
    idle = sim.sample(1000.0)[0]
    assert idle.mig_memory is not None and set(idle.mig_memory) == {d.uuid for d in mig.mig_devices}
    assert all(0 < mib < 20 for mib in idle.mig_memory.values())  # an instance's own context
    sim.assign(big.uuid, "job-1", "const:80:0.5")
    sim.assign(small.uuid, "job-2", "const:80:0.5")
    assert sim.assignment(big.uuid) == ("job-1", "const:80:0.5")
    busy = sim.sample(1001.0)[0]
    assert busy.mig_memory is not None
    # Half of each instance, whatever its size; the GPU adds up the instances (3/7 + 1/7 of 80% busy).
    assert busy.mig_memory[big.uuid] == pytest.approx(big.memory_mib / 2, rel=0.01)
    assert busy.mig_memory[small.uuid] == pytest.approx(small.memory_mib / 2, rel=0.01)
    assert busy.utilization_pct == round(80 * 4 / 7)
    assert busy.memory_used_mib == sum(busy.mig_memory.values())
    assert sim.sample(1002.0)[1].mig_memory is None  # the GPU that is not in MIG mode
    sim.release(small.uuid)
    assert sim.assignment(small.uuid) is None
    assert sim.sample(1003.0)[0].mig_memory[small.uuid] < 20  # type: ignore[index]


def test_simulated_hopper_instances_report_their_sm_activity():
    """An H100 in MIG mode gives each instance's SM activity (GPM), an A100 none: as NVML does."""
    sim = SimulatedBackend("n1", ["H100-80GB:mig=1g.10gb*7", "A100-80GB:mig=1g.10gb*7"], seed=3)
    h100, a100 = sim.discover()
    sim.assign(h100.mig_devices[0].uuid, "job-1", "const:80:0.5")
    sim.assign(a100.mig_devices[0].uuid, "job-2", "const:80:0.5")
    hopper, ampere = sim.sample(1000.0)
    assert hopper.mig_util is not None and hopper.mig_util[h100.mig_devices[0].uuid] == 80
    assert set(hopper.mig_util) == {d.uuid for d in h100.mig_devices}
    assert all(hopper.mig_util[d.uuid] == 0 for d in h100.mig_devices[1:])
    assert ampere.mig_util is None and ampere.mig_memory is not None


def test_simulated_jobs_on_shares_of_one_gpu_load_it_together():
    sim = SimulatedBackend("n1", ["A100-80GB"], seed=3)
    (gpu,) = sim.discover()
    quarter = 0.25 * gpu.memory_mib
    sim.assign(gpu.uuid, "job-1", "const:0:0.25")
    sim.assign(gpu.uuid, "job-2", "const:40:0.25")
    both = sim.sample(1000.0)[0]
    assert both.memory_used_mib == pytest.approx(2 * quarter, rel=0.01)
    assert both.utilization_pct == 40
    assert both.processes is not None and len(both.processes) == 2
    assert sum(mib for _, mib in both.processes) == pytest.approx(2 * quarter, rel=0.01)
    sim.release(gpu.uuid, "job-1")  # the other job goes on alone
    assert sim.assignment(gpu.uuid) == ("job-2", "const:40:0.25")
    assert sim.sample(1001.0)[0].memory_used_mib == pytest.approx(quarter, rel=0.01)
    sim.release(gpu.uuid, "job-2")
    assert sim.assignment(gpu.uuid) is None
    assert sim.sample(1002.0)[0].memory_used_mib < 10
