"""Simulated GPUs with real specs and real workload shapes, for development, demos, tests and benchmarks.

A free GPU idles: utilization 0, a few MiB of memory, idle power, temperature wandering near ambient. A GPU with a
job follows a profile: by default one of the per-container duty-cycle and memory series of Alibaba's GenAI trace
(see profiles/README.md), interpolated between its 57 s points with seeded noise at 1 Hz; or a declared constant
load (`"const:UTIL[:MEM_FRACTION]"`). Power follows utilization with a ~1.5 s lag, temperature follows power with a
~45 s lag, the SM clock boosts under load and drops back when idle.

Determinism: every GPU has its own random stream seeded from (node name, index, seed), drawn in a fixed order per
sample. The same seed and the same sequence of `assign`/`release`/`sample(now)` calls give the same samples, and
what happens on one GPU does not change another GPU's numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.gpu.base import HEALTH_OK, GpuInfo, GpuSample
from workers.gpu.mig import MigDevice, profile_fraction, simulated_mig_devices, split_model_spec
from workers.gpu.specs import GpuSpec, get_spec

PROFILE_FILE = Path(__file__).resolve().parent / "profiles" / "alibaba_genai_2026.json"
DEFAULT_IDLE_PROFILE = "idle-mostly"

_POWER_TAU_S = 1.5  # board power sensors average over about a second; the load change itself is instant
_TEMP_TAU_S = 45.0  # heat sink + airflow: tens of seconds to settle
_TEMP_RISE_AT_TDP_C = 45.0  # above ambient, at full board power, in a well-cooled server
_IDLE_CLOCK_AFTER_S = 5.0  # the driver drops boost clocks a few seconds after the last kernel

# What `nvidia-smi` says of simulated nodes: a current datacenter driver branch (DCGM_FI_DRIVER_VERSION).
SIMULATED_DRIVER_VERSION = "550.127.05"
# Memory clock (MHz, `nvidia-smi -q -d CLOCK` under load) by model family; HBM runs a few °C above the die.
_MEM_CLOCK_MHZ = {"A100-40GB": 1215, "A100": 1593, "H100": 2619, "H200": 3201, "L40S": 9001, "V100": 877, "RTX": 8001}
_MEM_TEMP_OFFSET_C = 4.0
_NO_NVLINK = ("L40S", "RTX")  # PCIe-only boards: NVML answers NOT_SUPPORTED, so no NVLink series
_PCIE_PEAK_KBPS = 12e9 / 1024  # a busy data loader keeps a Gen4 x16 link well below its 32 GB/s
_NVLINK_PEAK_KIBPS = 150e6 / 1.024  # all-reduce traffic of data-parallel training, all links, KiB/s


@dataclass(frozen=True)
class Profile:
    """A usage shape: utilization % and memory MiB at regular points (one point per `step_s`)."""

    name: str
    kind: str
    step_s: float
    util: tuple[float, ...]
    mem_mib: tuple[float, ...]
    tensor_ratio: float
    mem_fraction_of_device: float | None = None  # const profiles: memory as a share of the GPU's memory

    def at(self, position_s: float) -> tuple[float, float]:
        """(utilization %, memory MiB) at `position_s` seconds into the profile, linearly interpolated, looping."""
        n = len(self.util)
        if n == 1:
            return self.util[0], self.mem_mib[0]
        x = position_s / self.step_s
        i0 = math.floor(x)
        frac = x - i0
        i0 %= n
        i1 = (i0 + 1) % n
        util = self.util[i0] + (self.util[i1] - self.util[i0]) * frac
        mem = self.mem_mib[i0] + (self.mem_mib[i1] - self.mem_mib[i0]) * frac
        return util, mem

    @property
    def duration_s(self) -> float:
        return len(self.util) * self.step_s


@functools.lru_cache(maxsize=4)
def load_profiles(path: Path = PROFILE_FILE) -> dict[str, Profile]:
    """The trace profiles from the JSON that profiles/build_profiles.py writes (cached: read once per process)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    step = float(doc["step_s"])
    ref = float(doc["mem_ref_mib"])
    return {
        name: Profile(
            name=name,
            kind=p["kind"],
            step_s=step,
            util=tuple(float(u) for u in p["util"]),
            mem_mib=tuple(m / 1000.0 * ref for m in p["mem"]),
            tensor_ratio=float(p["tensor_ratio"]),
        )
        for name, p in doc["profiles"].items()
    }


def job_profiles() -> list[str]:
    """Names of the trace profiles that look like work (the default pool for a job without a declared profile)."""
    return sorted(name for name, p in load_profiles().items() if p.kind != "idle")


def parse_profile(spec: str) -> Profile:
    """A profile by trace name ("train-heavy-a") or a declared constant load ("const:80" or "const:80:0.5")."""
    if spec.startswith("const:"):
        parts = spec.split(":")
        try:
            util = float(parts[1])
            mem_fraction = float(parts[2]) if len(parts) > 2 else 0.5
        except (IndexError, ValueError):
            raise ValueError(f"bad profile {spec!r}: expected const:UTIL[:MEM_FRACTION]") from None
        if len(parts) > 3 or not 0 <= util <= 100 or not 0 <= mem_fraction <= 1:
            raise ValueError(f"bad profile {spec!r}: UTIL in 0..100, MEM_FRACTION in 0..1")
        return Profile(
            name=spec,
            kind="const",
            step_s=60.0,
            util=(util,),
            mem_mib=(0.0,),
            tensor_ratio=0.5,
            mem_fraction_of_device=mem_fraction,
        )
    profiles = load_profiles()
    if spec not in profiles:
        raise ValueError(f"unknown profile {spec!r}; known: {', '.join(sorted(profiles))}, const:UTIL[:MEM]")
    return profiles[spec]


def _stable_int(*parts: object) -> int:
    # Python's hash() is salted per process; a digest keeps offsets and pids the same across runs.
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def simulated_uuid(node_name: str, index: int, seed: int) -> str:
    """A stable NVML-style UUID ("GPU-8hex-4hex-4hex-4hex-12hex") for a simulated GPU."""
    h = hashlib.sha256(f"{node_name}|{index}|{seed}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class _Run:
    """What occupies a GPU: a job (or the idle replay) following a profile."""

    job_key: str
    profile: Profile
    offset_s: float
    started_at: float | None  # set by the first sample after assignment
    pid: int
    memory_mib: int = 0  # a share's memory budget: the job scales its profile's memory to it (0: the whole GPU)
    uid: int | None = None  # the owner its process runs as (a load that is no portal job's: a holder's shell)


class _SimGpu:
    def __init__(self, info: GpuInfo, spec: GpuSpec, rng: random.Random, ambient_c: float) -> None:
        self.info = info
        self.spec = spec
        self.rng = rng
        self.run: _Run | None = None
        self.idle_run: _Run | None = None
        self.last_now: float | None = None
        self.power_w = float(spec.idle_w)
        self.ambient_drift_c = 0.0
        self.temp_c = ambient_c + spec.idle_w / spec.tdp_w * _TEMP_RISE_AT_TDP_C
        self.idle_mem_mib = 1 + rng.randrange(4)  # driver context, persistence mode: a few MiB on a free GPU
        self.mig_runs: dict[str, _Run] = {}  # MIG mode: the job on each instance, by the instance's uuid
        self.shared_runs: dict[str, _Run] = {}  # a GPU split in shares: the jobs beside `run`, by job key
        self.last_busy: float = -math.inf
        self.health: dict[str, Any] = dict(HEALTH_OK)
        # Device counters (base.COUNTER_KEYS) that accumulate; derived from the state above, never from `rng`, so
        # they do not shift the seeded draws of the other readings.
        self.energy_mj = float(_stable_int(info.uuid, "energy") % 10**9)  # since a driver load days ago
        self.nvlink_kib: float | None = None if spec.key.startswith(_NO_NVLINK) else 0.0
        self.mem_clock_mhz = next((mhz for prefix, mhz in _MEM_CLOCK_MHZ.items() if spec.key.startswith(prefix)), 1215)


class SimulatedBackend:
    """GpuBackend over simulated GPUs of the given models (keys of workers.gpu.specs, e.g. "A100-80GB")."""

    def __init__(
        self,
        node_name: str,
        models: list[str],
        seed: int = 0,
        *,
        replay_idle: bool | str = False,
        ambient_c: float = 28.0,
        slow_every_s: float = 10.0,
    ) -> None:
        self.node_name = node_name
        self.seed = seed
        self._ambient_c = ambient_c
        self._slow_every_s = slow_every_s
        self._last_slow = -math.inf
        self._idle_profile = (
            parse_profile(DEFAULT_IDLE_PROFILE if replay_idle is True else replay_idle) if replay_idle else None
        )
        self._gpus: list[_SimGpu] = []
        for index, model_spec in enumerate(models):
            # "A100-80GB:mig=1g.10gb*7": a GPU in MIG mode with that layout (workers.gpu.mig.split_model_spec).
            model, layout = split_model_spec(model_spec)
            spec = get_spec(model)
            uuid = simulated_uuid(node_name, index, seed)
            info = GpuInfo(
                uuid=uuid,
                index=index,
                name=spec.nvml_names[0],
                model=spec.key,
                memory_mib=spec.memory_mib,
                mig_mode=bool(layout),
                mig_devices=simulated_mig_devices(uuid, spec.key, layout),
                extra={"simulated": True, "driver_version": SIMULATED_DRIVER_VERSION},
            )
            gpu = _SimGpu(info, spec, random.Random(f"{node_name}|{index}|{seed}"), ambient_c)
            if self._idle_profile is not None:
                gpu.idle_run = self._new_run("idle-replay", self._idle_profile, info.uuid)
            self._gpus.append(gpu)
        self._by_uuid = {g.info.uuid: g for g in self._gpus}
        self._by_instance = {d.uuid: g for g in self._gpus for d in g.info.mig_devices}
        self._layouts_made = 0
        self._layout_changed = False

    # -- GpuBackend ------------------------------------------------------------------------------------------

    def discover(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def set_layout(self, uuid: str, layout: str) -> tuple[MigDevice, ...]:
        """What an admin's mig-parted does: make the GPU's MIG instances anew (new uuids) in `layout`
        ("1g.10gb*7", "3g.40gb+4g.40gb"; "" turns MIG mode off). Jobs on instances that vanish are gone. The
        agent sees it at its next `refresh_layout()`. ValueError for a layout the GPU cannot have."""
        gpu = self._gpu(uuid)
        _, profiles = split_model_spec(f"{gpu.info.model}:mig={layout}" if layout else gpu.info.model)
        self._layouts_made += 1
        devices = simulated_mig_devices(uuid, gpu.info.model, profiles, made=self._layouts_made)
        for gone in set(gpu.mig_runs) - {d.uuid for d in devices}:
            gpu.mig_runs.pop(gone)
        gpu.info = dataclasses.replace(gpu.info, mig_mode=bool(profiles), mig_devices=devices)
        self._by_instance = {d.uuid: g for g in self._gpus for d in g.info.mig_devices}
        self._layout_changed = True
        return devices

    def refresh_layout(self) -> bool:
        """`LayoutRefresh`: whether `set_layout` changed a layout since the last call."""
        changed, self._layout_changed = self._layout_changed, False
        return changed

    def sample(self, now: float) -> list[GpuSample]:
        slow = now - self._last_slow >= self._slow_every_s
        if slow:
            self._last_slow = now
        return [self._sample_gpu(g, now, slow) for g in self._gpus]

    def close(self) -> None:
        """Nothing to release; present for the protocol."""

    # -- control ---------------------------------------------------------------------------------------------

    def assign(
        self, uuid: str, job_key: str, profile: str | None = None, *, memory_mib: int = 0, uid: int | None = None
    ) -> None:
        """Start a job on a GPU or on a MIG instance (a `MIG-` uuid). Without a profile one of the trace's work
        profiles is chosen from the job key, so all GPUs of one job follow the same profile in step (as
        data-parallel training does). ``memory_mib``: the budget of a job on a share of the GPU; the job holds
        what its profile asks of a GPU of that size, as a job on a MIG instance does of the instance's memory
        (nothing enforces a time-sliced share's budget: the simulated job is one that keeps to it). ``uid``: the
        owner its process runs as, for a load that stands for a person's own work rather than a portal job's."""
        if profile is None:
            names = job_profiles()
            profile = names[_stable_int(self.seed, job_key, "profile") % len(names)]
        if memory_mib < 0:
            raise ValueError(f"a memory budget cannot be negative ({memory_mib} MiB)")
        run = self._new_run(job_key, parse_profile(profile), job_key)
        run.memory_mib = memory_mib
        run.uid = uid
        parent = self._by_instance.get(uuid)
        if parent is not None:
            parent.mig_runs[uuid] = run
            return
        gpu = self._gpu(uuid)
        if gpu.run is None or gpu.run.job_key == job_key:
            gpu.run = run
        else:  # another job on a GPU split in shares: both load it
            gpu.shared_runs[job_key] = run

    def release(self, uuid: str, job_key: str | None = None) -> None:
        """The job (`job_key`; without it, every job) on this GPU or instance ended; it goes back to idle (power
        and temperature decay with their lag), or to the jobs still sharing it."""
        parent = self._by_instance.get(uuid)
        if parent is not None:
            parent.mig_runs.pop(uuid, None)
            return
        gpu = self._gpu(uuid)
        if job_key is None:
            gpu.run = None
            gpu.shared_runs.clear()
        elif job_key in gpu.shared_runs:
            del gpu.shared_runs[job_key]
        elif gpu.run is not None and gpu.run.job_key == job_key:
            gpu.run = gpu.shared_runs.pop(next(iter(gpu.shared_runs))) if gpu.shared_runs else None

    def assignment(self, uuid: str) -> tuple[str, str] | None:
        """(job key, profile name) of the job on this GPU or instance, or None when it is free."""
        parent = self._by_instance.get(uuid)
        run = parent.mig_runs.get(uuid) if parent is not None else self._gpu(uuid).run
        return (run.job_key, run.profile.name) if run else None

    def job_of_pid(self, pid: int) -> int | None:
        """The portal job whose simulated load has this pid (the agent assigns jobs as `job-<id>`), or None."""
        for gpu in self._gpus:
            # Copies: the job runner's threads assign and release while the sampler's thread asks.
            for run in (gpu.run, *list(gpu.shared_runs.values()), *list(gpu.mig_runs.values())):
                if run is not None and run.pid == pid and run.job_key[:4] == "job-" and run.job_key[4:].isdigit():
                    return int(run.job_key[4:])
        return None

    def uid_of_pid(self, pid: int) -> int | None:
        """The owner uid of a simulated load's pid (set by `assign`), or None. Never the host's /proc: a simulated
        pid is no host process."""
        for gpu in self._gpus:
            for run in (gpu.run, *list(gpu.shared_runs.values()), *list(gpu.mig_runs.values())):
                if run is not None and run.pid == pid:
                    return run.uid
        return None

    def inject(
        self,
        uuid: str,
        *,
        lost: bool | None = None,
        xid: int | None = None,
        ecc_dbe: int | None = None,
        remapped_rows: tuple[int, int] | None = None,
        remap_failed: bool | None = None,
    ) -> None:
        """Fault injection for tests and demos: mark a GPU lost, record a critical Xid, set the ECC DBE count, set
        the (correctable, uncorrectable) remapped row counts, flag a failed row remap."""
        gpu = self._gpu(uuid)
        if remapped_rows is not None:
            gpu.health["remap_cor"], gpu.health["remap_unc"] = remapped_rows
        if remap_failed is not None:
            gpu.health["remap_fail"] = remap_failed
        if lost is not None:
            gpu.health["lost"] = lost
        if xid is not None:
            gpu.health["xid"] = int(gpu.health["xid"]) + 1
            gpu.health["last_xid"] = xid
        if ecc_dbe is not None:
            gpu.health["ecc_dbe"] = ecc_dbe

    # -- internals -------------------------------------------------------------------------------------------

    def _gpu(self, uuid: str) -> _SimGpu:
        try:
            return self._by_uuid[uuid]
        except KeyError:
            raise KeyError(f"no simulated GPU {uuid!r} on node {self.node_name!r}") from None

    def _new_run(self, job_key: str, profile: Profile, offset_key: str) -> _Run:
        # Start somewhere inside the profile (keyed, not random) so that jobs sharing a profile do not march in
        # lockstep, while the GPUs of one job do.
        steps = len(profile.util)
        offset = (_stable_int(self.seed, offset_key, "offset") % steps) * profile.step_s
        pid = 1000 + _stable_int(self.seed, job_key, "pid") % 4_000_000
        return _Run(job_key=job_key, profile=profile, offset_s=offset, started_at=None, pid=pid)

    def _sample_gpu(self, gpu: _SimGpu, now: float, slow: bool) -> GpuSample:
        spec = gpu.spec
        rng = gpu.rng
        dt = 0.0 if gpu.last_now is None else max(0.0, now - gpu.last_now)
        gpu.last_now = now
        if gpu.health["lost"]:
            return GpuSample(
                uuid=gpu.info.uuid,
                ts=now,
                utilization_pct=None,
                memory_used_mib=None,
                memory_total_mib=None,
                temperature_c=None,
                power_w=None,
                sm_clock_mhz=None,
                tensor_active=None,
                processes=None,
                health=dict(gpu.health),
                error="GPU lost (simulated)",
            )

        run = gpu.run or gpu.idle_run
        util = 0.0
        mem = float(gpu.idle_mem_mib)
        tensor_ratio = 0.0
        if run is not None:
            if run.started_at is None:
                run.started_at = now
            base_util, base_mem = run.profile.at(now - run.started_at + run.offset_s)
            base_mem = _job_memory(run, base_mem, spec.memory_mib)
            # A per-minute duty cycle of 30% is bursts and gaps at 1 Hz: spread grows with p(1-p).
            noise = rng.gauss(0.0, 1.0)
            if base_util >= 0.5:
                util = base_util + noise * (0.25 * math.sqrt(base_util * (100.0 - base_util)) + 1.0)
            mem_noise = rng.gauss(0.0, 1.0)
            mem = max(mem, base_mem * (1.0 + 0.0005 * mem_noise))
            tensor_ratio = run.profile.tensor_ratio
        own_util = util
        busy_by_pid: dict[int, int] = {}  # per-process SM % (NVML's per-process utilization)
        shared_processes: list[tuple[int, int]] = []
        for other in gpu.shared_runs.values():  # the other jobs on a shared GPU add their load, without noise
            if other.started_at is None:
                other.started_at = now
            other_util, other_mem = other.profile.at(now - other.started_at + other.offset_s)
            other_mem = _job_memory(other, other_mem, spec.memory_mib)
            util += other_util
            mem += other_mem
            tensor_ratio = max(tensor_ratio, other.profile.tensor_ratio)
            shared_processes.append((other.pid, int(other_mem)))
            busy_by_pid[other.pid] = round(max(0.0, min(100.0, other_util)))
        mig_memory: dict[str, int] | None = None
        mig_util: dict[str, int] | None = None
        mig_processes: list[tuple[int, int]] = []
        if gpu.info.mig_devices:
            util, mem, tensor_ratio, mig_memory, mig_processes, mig_busy = self._mig_load(
                gpu, now, util, mem, tensor_ratio
            )
            mig_util = mig_busy if spec.gpm else None  # NVML gives an instance's SM activity only through GPM
        util = max(0.0, min(100.0, util))
        util_pct = round(util)
        mem_used = int(min(mem, spec.memory_mib * 0.97))

        # Power: idle floor, plus a share of the headroom set by utilization and how tensor-heavy the work is,
        # plus a little for held memory (HBM stays awake); then a first-order lag.
        target_w = spec.idle_w + (spec.tdp_w * 0.95 - spec.idle_w) * (util / 100.0) * (0.6 + 0.4 * tensor_ratio)
        if mem_used > 1024:
            target_w += 0.02 * spec.tdp_w
        gpu.power_w = _approach(gpu.power_w, target_w, dt, _POWER_TAU_S)
        power = max(0.0, gpu.power_w + rng.gauss(0.0, 0.004 * spec.tdp_w))

        # Temperature: ambient wanders slowly within ±1.5 °C; the die heads for ambient + a power-driven rise.
        gpu.ambient_drift_c = max(-1.5, min(1.5, gpu.ambient_drift_c + rng.gauss(0.0, 0.05) * math.sqrt(dt)))
        target_c = self._ambient_c + gpu.ambient_drift_c + gpu.power_w / spec.tdp_w * _TEMP_RISE_AT_TDP_C
        gpu.temp_c = _approach(gpu.temp_c, target_c, dt, _TEMP_TAU_S)

        if util_pct > 0:
            gpu.last_busy = now
        if now - gpu.last_busy < _IDLE_CLOCK_AFTER_S:
            # Near the power limit the boost clock backs off a little, as real boards do.
            over = max(0.0, gpu.power_w / spec.tdp_w - 0.85) / 0.15
            sm = round(spec.sm_clock_max_mhz * (1.0 - 0.08 * min(1.0, over)))
        else:
            sm = spec.sm_clock_idle_mhz

        tensor = 0.0
        if util_pct > 0 and tensor_ratio > 0:
            tensor = max(0.0, min(1.0, util / 100.0 * tensor_ratio * (1.0 + 0.1 * rng.gauss(0.0, 1.0))))

        processes: list[tuple[int, int]] | None = None
        process_util: dict[int, int] | None = None
        if slow:
            own = mem_used - gpu.idle_mem_mib - sum(mib for _, mib in shared_processes)
            processes = [] if run is None else [(run.pid, max(0, own))]
            processes += shared_processes + mig_processes
            if not gpu.info.mig_devices and processes:  # NVML has no per-process utilization in MIG mode
                if run is not None:
                    busy_by_pid[run.pid] = round(max(0.0, min(100.0, own_util)))
                process_util = {pid: busy_by_pid.get(pid, 0) for pid, _ in processes}
        counters = self._counters(gpu, util / 100.0, tensor_ratio, dt)
        return GpuSample(
            uuid=gpu.info.uuid,
            ts=now,
            utilization_pct=util_pct,
            memory_used_mib=mem_used,
            memory_total_mib=spec.memory_mib,
            temperature_c=round(gpu.temp_c),
            power_w=round(power, 1),
            sm_clock_mhz=sm,
            tensor_active=round(tensor, 3),
            processes=processes,
            health=dict(gpu.health),
            error=None,
            counters=counters,
            mig_memory=mig_memory,
            mig_util=mig_util,
            process_util=process_util,
        )

    @staticmethod
    def _mig_load(
        gpu: _SimGpu, now: float, util: float, mem: float, tensor_ratio: float
    ) -> tuple[float, float, float, dict[str, int], list[tuple[int, int]], dict[str, int]]:
        """A GPU in MIG mode: each instance holds what its job's profile asks of a GPU of the instance's size;
        the GPU's utilization adds up the instances' by their compute fraction (1g = 1/7), its memory is their
        sum. Returns (util, mem, tensor ratio, MiB used per instance, processes as (pid, MiB), % of each instance's
        SMs busy)."""
        per_instance: dict[str, int] = {}
        busy: dict[str, int] = {}
        processes: list[tuple[int, int]] = []
        for device in gpu.info.mig_devices:
            # A MIG instance's own context: about a dozen MiB even with nothing running, as nvidia-smi shows.
            used = float(12 + _stable_int(device.uuid, "idle") % 4)
            run = gpu.mig_runs.get(device.uuid)
            if run is not None:
                if run.started_at is None:
                    run.started_at = now
                base_util, base_mem = run.profile.at(now - run.started_at + run.offset_s)
                fraction = run.profile.mem_fraction_of_device
                if fraction is None:
                    fraction = base_mem / gpu.spec.memory_mib
                job_mib = min(
                    fraction * device.memory_mib * (1.0 + 0.0005 * gpu.rng.gauss(0.0, 1.0)), 0.97 * device.memory_mib
                )
                used = max(used, job_mib)
                util += base_util * float(profile_fraction(device.profile))
                busy[device.uuid] = round(max(0.0, min(100.0, base_util)))
                tensor_ratio = max(tensor_ratio, run.profile.tensor_ratio)
                processes.append((run.pid, int(used)))
            per_instance[device.uuid] = int(used)
            busy.setdefault(device.uuid, 0)
        return util, max(mem, float(sum(per_instance.values()))), tensor_ratio, per_instance, processes, busy

    @staticmethod
    def _counters(gpu: _SimGpu, load: float, tensor_ratio: float, dt: float) -> dict[str, int]:
        """The dcgm-style device counters of this tick (base.COUNTER_KEYS), from the power, temperature and load
        already simulated: energy integrates the board power, traffic follows the load."""
        gpu.energy_mj += gpu.power_w * dt * 1000.0
        pcie = _PCIE_PEAK_KBPS * load * (1.0 - 0.5 * tensor_ratio)  # tensor-heavy work stays on the device
        counters = {
            "mt": round(gpu.temp_c + _MEM_TEMP_OFFSET_C),
            "mc": gpu.mem_clock_mhz,
            "en": int(gpu.energy_mj),
            "ptx": int(pcie * 0.3),
            "prx": int(pcie),
            "prc": 0,
        }
        if gpu.nvlink_kib is not None:
            gpu.nvlink_kib += _NVLINK_PEAK_KIBPS * load * tensor_ratio * dt
            counters["nvl"] = int(gpu.nvlink_kib)
        return counters


def _job_memory(run: _Run, profile_mib: float, device_mib: int) -> float:
    """MiB a job holds at a point of its profile on a GPU of ``device_mib``: the profile's share of the device,
    scaled to the job's budget when it has one (and kept under it, as an allocator told its budget does)."""
    fraction = run.profile.mem_fraction_of_device
    if fraction is None:
        fraction = profile_mib / device_mib
    if run.memory_mib <= 0:
        return fraction * device_mib
    budget = min(run.memory_mib, device_mib)
    return min(fraction * budget, 0.97 * budget)


def _approach(value: float, target: float, dt: float, tau: float) -> float:
    """First-order lag: where `value` is after `dt` seconds heading for `target` with time constant `tau`."""
    return target + (value - target) * math.exp(-dt / tau)
