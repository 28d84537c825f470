"""NVIDIA's MIG profiles per GPU model: the vocabulary shared by the agent, the simulated backend and the portal.

A MIG profile `<g>g.<m>gb` is a GPU instance with g of the GPU's 7 compute slices and about m GB of its memory.
The portal never repartitions a GPU (admins choose the layout with NVIDIA's mig-parted); it validates the profiles
a booking or job asks for against these tables, prices an instance at g/7 of its GPU, and the simulated backend
builds its layouts from them. `max_count` is how many instances of that profile alone fit on one GPU; `memory_mib`
what the driver reports for such an instance (`nvidia-smi mig -lgip`: a little under the nominal size, the rest
holds the instance's own structures). Plain data, no NVML import.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

COMPUTE_SLICES = 7
"""Every MIG-capable datacenter GPU here (A100, H100, H200) has 7 compute slices."""

_PROFILE_RE = re.compile(r"^(\d)g\.(\d+)gb$")
_CI_PROFILE_RE = re.compile(r"^(\d)c\.((\d)g\.\d+gb)$")
"""A compute instance that takes part of its GPU instance's slices ("1c.3g.20gb": 1 of a 3g.20gb's 3): NVIDIA's
name for such a MIG device. Its siblings in the same GPU instance share that instance's memory."""


@dataclass(frozen=True)
class MigProfile:
    name: str
    slices: int
    memory_mib: int
    max_count: int

    @property
    def fraction(self) -> Fraction:
        """The instance's share of its GPU's compute (what it is billed at by default): 1g = 1/7."""
        return Fraction(self.slices, COMPUTE_SLICES)


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU as the agent reports it: its own uuid (`MIG-...`), profile, memory and GPU instance
    id (what dcgm-exporter labels GPU_I_ID)."""

    uuid: str
    profile: str
    memory_mib: int
    gi_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "profile": self.profile, "memory_mib": self.memory_mib, "gi_id": self.gi_id}


def _table(*rows: tuple[str, int, int]) -> dict[str, MigProfile]:
    out = {}
    for name, memory_mib, max_count in rows:
        m = _PROFILE_RE.match(name)
        assert m, name
        out[name] = MigProfile(name=name, slices=int(m.group(1)), memory_mib=memory_mib, max_count=max_count)
    return out


_A100_80 = _table(
    ("1g.10gb", 9_728, 7),
    ("1g.20gb", 19_968, 4),
    ("2g.20gb", 19_968, 3),
    ("3g.40gb", 40_192, 2),
    ("4g.40gb", 40_192, 1),
    ("7g.80gb", 80_896, 1),
)

MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-80GB": _A100_80,
    "H100-80GB": _A100_80,
    "A100-40GB": _table(
        ("1g.5gb", 4_864, 7),
        ("2g.10gb", 9_984, 3),
        ("3g.20gb", 20_096, 2),
        ("4g.20gb", 20_096, 1),
        ("7g.40gb", 40_448, 1),
    ),
    "H200-141GB": _table(
        ("1g.18gb", 16_384, 7),
        ("1g.35gb", 32_768, 4),
        ("2g.35gb", 32_768, 3),
        ("3g.71gb", 70_144, 2),
        ("4g.71gb", 70_144, 1),
        ("7g.141gb", 143_104, 1),
    ),
}
"""Per portal model key (workers.gpu.specs): the GPU-instance profiles NVIDIA defines for it."""


def profiles_for(model: str) -> dict[str, MigProfile]:
    """The MIG profiles of a model key; empty when the model has no MIG (L40S, V100, RTX)."""
    return MIG_PROFILES.get(model, {})


def all_profile_names() -> set[str]:
    return {name for table in MIG_PROFILES.values() for name in table}


def profile_fraction(name: str) -> Fraction:
    """The compute fraction of any `<g>g.<m>gb` profile name (1g.10gb -> 1/7), or of a compute instance's
    `<c>c.<g>g.<m>gb` (1c.3g.20gb -> 1/7: its own slices, not its GPU instance's); ValueError for another name."""
    ci = _CI_PROFILE_RE.match(name)
    if ci:
        c, g = int(ci.group(1)), int(ci.group(3))
        if not 1 <= c < g <= COMPUTE_SLICES:
            raise ValueError(f"not a MIG profile name: {name!r}")
        return Fraction(c, COMPUTE_SLICES)
    m = _PROFILE_RE.match(name)
    if not m or not 1 <= int(m.group(1)) <= COMPUTE_SLICES:
        raise ValueError(f"not a MIG profile name: {name!r}")
    return Fraction(int(m.group(1)), COMPUTE_SLICES)


def gpu_instance_profile(name: str) -> str:
    """The GPU-instance profile a MIG device's profile belongs to ("1c.3g.20gb" -> "3g.20gb"; "1g.10gb" as it is)."""
    ci = _CI_PROFILE_RE.match(name)
    return ci.group(2) if ci else name


def is_profile_name(name: str) -> bool:
    """Whether a booking or job may ask for `name`: a GPU-instance profile NVIDIA defines for a model the portal
    knows, or a compute instance of one (`<c>c.` with fewer slices than its GPU instance)."""
    if name in all_profile_names():
        return True
    if _CI_PROFILE_RE.match(name) is None or gpu_instance_profile(name) not in all_profile_names():
        return False
    try:
        profile_fraction(name)
    except ValueError:
        return False
    return True


def profile_from_device_name(device_name: str) -> str | None:
    """The profile in a MIG device's NVML name ("NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb"; a compute
    instance that is part of its GPU instance, "... MIG 1c.3g.40gb" -> "1c.3g.40gb"), or None. A "+me" suffix (the
    instance that owns the media engines) is dropped: it books and bills as its base profile."""
    m = re.search(r"MIG ((?:\d+c\.)?\d+g\.\d+gb)\b", device_name)
    return m.group(1) if m else None


def layout_fits(model: str, profiles: list[str]) -> bool:
    """Whether a layout (profile names) fits one GPU of `model` by compute slices and by each profile's count.

    A coarse check (the hardware also constrains where each instance may sit); enough to refuse a layout that
    cannot exist, such as eight 1g instances."""
    table = profiles_for(model)
    if not profiles or any(p not in table for p in profiles):
        return False
    if sum(table[p].slices for p in profiles) > COMPUTE_SLICES:
        return False
    whole = max(t.memory_mib for t in table.values())  # the 7g instance: all the memory there is
    if sum(table[p].memory_mib for p in profiles) > whole:
        return False
    return all(profiles.count(p) <= table[p].max_count for p in set(profiles))


def split_model_spec(spec: str) -> tuple[str, list[str]]:
    """A simulated GPU's spec, "A100-80GB" or "A100-80GB:mig=1g.10gb*7" or "A100-80GB:mig=3g.40gb+4g.40gb", as
    (model key, MIG layout: profile names, empty when not in MIG mode). ValueError for a layout that cannot exist."""
    model, _, rest = spec.partition(":")
    if not rest:
        return model, []
    if not rest.startswith("mig="):
        raise ValueError(f"bad GPU spec {spec!r}: MODEL or MODEL:mig=PROFILE*N+PROFILE")
    profiles: list[str] = []
    for part in rest[4:].split("+"):
        name, _, times = part.partition("*")
        profiles += [name] * (int(times) if times else 1)
    if not layout_fits(model, profiles):
        raise ValueError(f"MIG layout {profiles} does not fit a {model}")
    return model, profiles


def simulated_mig_devices(parent_uuid: str, model: str, profiles: list[str], *, made: int = 0) -> tuple[MigDevice, ...]:
    """The instances of a simulated layout: stable `MIG-` uuids derived from the GPU's, GPU instance ids in the
    order NVIDIA's tools number them from the largest profile down (any stable order would do). `made` counts
    the times the layout was made again: as on a real GPU, instances made anew have new uuids."""
    table = profiles_for(model)
    out = []
    for n, name in enumerate(sorted(profiles, key=lambda p: (-table[p].slices, p))):
        key = f"{parent_uuid}|{n}|{name}" + (f"|{made}" if made else "")
        h = hashlib.sha256(key.encode()).hexdigest()
        uuid = f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        out.append(MigDevice(uuid=uuid, profile=name, memory_mib=table[name].memory_mib, gi_id=n + 1))
    return tuple(out)
