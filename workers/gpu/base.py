"""The GPU backend interface of the node agent, and the telemetry message it sends.

Plain Python on purpose: GPU nodes run the agent without Django, and the portal side can import this module to
decode messages without pulling in NVML or torch.

Telemetry message (one per second per node, JSON; built by `build_message`, read back by `parse_message`)::

    {"type": "telemetry", "v": 1, "node": "gpu-node-01", "ts": 1767225600.0, "seq": 42,
     "f": ["uuid", "util", "mem", "mem_total", "temp", "power", "sm", "tensor"],
     "g": [["GPU-5f1c...", 87, 30512, 81920, 64, 312.4, 1410, 0.412],
           ["GPU-9a0b...", 0, 3, 81920, 31, 58.9, 210, null, {"p": [], "h": {"xid": 1, "last_xid": 79}}]]}

- `ts` is the node's wall clock (epoch seconds) when the tick started; every GPU in the message shares it.
- `seq` counts messages since the agent started, so the portal can see gaps and agent restarts (seq goes back).
- `f` names the positional columns of each row in `g`; it is constant for `v` 1 and sent so that a reader can
  check it, not parse by it. Columns: utilization % (int), memory used MiB (int), memory total MiB (int),
  temperature °C (int), power W (1 decimal), SM clock MHz (int), tensor-pipe activity 0..1 (3 decimals).
  Any of them is `null` when the GPU does not support that counter or the read failed this tick.
- An optional 9th element carries what is usually absent, to keep the common row at ~80 bytes:
  `"p"`: per-process memory `[[pid, used_mib], ...]`, present only on ticks where processes were read (the
  NVML call is slow, so the agent reads it every ~10 s; absent means "not read this tick", `[]` means "none");
  where NVML gives per-process utilization (not in MIG mode), each entry has a third element, the mean % of the
  GPU's SMs the process kept busy since the last read (`[[pid, used_mib, sm_pct], ...]`; 0 for a process that
  ran no kernel);
  `"h"`: only the health keys that signal a problem (`ecc_dbe` > 0 volatile double-bit ECC errors, `xid` > 0
  critical Xid events seen since the agent started, `last_xid`, `lost`: true when the GPU stopped answering,
  `remap_cor` / `remap_unc` rows remapped for correctable / uncorrectable errors, `remap_fail`: true when a
  row remap failed); a reader fills the rest from `HEALTH_OK`;
  `"x"`: the device counters dcgm-exporter exports by default that NVML gives, positional like the row (ints,
  `null` where the GPU has none, trailing nulls cut): `COUNTER_KEYS` = `mt` memory temperature °C, `mc` memory
  clock MHz, `en` energy since the driver loaded (mJ), `ptx` / `prx` PCIe throughput (KB/s, as NVML reports it),
  `prc` PCIe replays (count), `nvl` NVLink traffic over all links (KiB, cumulative); ~45 bytes a row;
  `"m"`: on a GPU in MIG mode, the memory each MIG instance uses, `[["MIG-...", used_mib], ...]` (an instance
  whose read failed is left out), with a third element on GPUs with GPM, the % of the instance's SMs that were
  busy since the last tick (`[["MIG-...", used_mib, sm_pct], ...]`); the row's own `mem` is then the sum over the
  GPU;
  `"j"`: the memory each portal job uses on this GPU, `[[job_id, used_mib], ...]`: its processes (or its MIG
  instance) as the agent attributes them (workers/jobmem.py), on the ticks where they were read; with a third
  element where its SM activity is known (its processes' per-process utilization added up, or its MIG
  instance's GPM reading): `[[job_id, used_mib, sm_pct], ...]`;
  `"o"`: what the processes of no portal job use together, `[used_mib]` or `[used_mib, sm_pct]`, on the ticks
  where the process listing shows everything on the GPU (workers/jobmem.py);
  `"ou"`: the same per owner, on the same ticks: `[[uid, used_mib], ...]` or `[[uid, used_mib, sm_pct], ...]`
  (the real uid of the processes; `[]` when no job's process is on the GPU);
  `"e"`: an error text for this GPU this tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from workers.gpu.mig import MigDevice

MESSAGE_TYPE = "telemetry"
MESSAGE_VERSION = 1
ROW_FIELDS: tuple[str, ...] = ("uuid", "util", "mem", "mem_total", "temp", "power", "sm", "tensor")

# Health as a GPU that is fine reports it; rows only carry the keys that differ, so most rows carry none.
HEALTH_OK: dict[str, Any] = {
    "ecc_dbe": 0,
    "xid": 0,
    "last_xid": None,
    "lost": False,
    "remap_cor": 0,
    "remap_unc": 0,
    "remap_fail": False,
}
# The positions of the `"x"` list (see the module docstring); all numbers >= 0.
COUNTER_KEYS: tuple[str, ...] = ("mt", "mc", "en", "ptx", "prx", "prc", "nvl")


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as discovered on the node: identity and static properties."""

    uuid: str
    index: int
    name: str  # as the driver reports it, e.g. "NVIDIA A100-SXM4-80GB"
    model: str  # model key from workers.gpu.specs, e.g. "A100-80GB"
    memory_mib: int
    mig_mode: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    mig_devices: tuple[MigDevice, ...] = ()  # its MIG instances when in MIG mode (workers.gpu.nvml_mig)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the agent's registration message."""
        return {
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "model": self.model,
            "memory_mib": self.memory_mib,
            "mig_mode": self.mig_mode,
            "extra": dict(self.extra),
            "mig_devices": [d.to_dict() for d in self.mig_devices],
        }


@dataclass(frozen=True)
class GpuSample:
    """One GPU's readings at one tick. None means not supported or not readable this tick."""

    uuid: str
    ts: float
    utilization_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    tensor_active: float | None = None
    processes: list[tuple[int, int]] | None = None  # None: not sampled this tick; []: sampled, none running
    health: dict[str, Any] = field(default_factory=lambda: dict(HEALTH_OK))
    error: str | None = None
    counters: dict[str, int] = field(default_factory=dict)  # COUNTER_KEYS the GPU has; missing: not readable
    mig_memory: dict[str, int] | None = None  # MIG mode: MiB used per instance uuid; None: not a MIG GPU or unread
    mig_util: dict[str, int] | None = None  # MIG mode with GPM: % of each instance's SMs busy; None: not read
    job_memory: dict[int, int] | None = None  # MiB used per portal job id; None: not attributed this tick
    # Per-process utilization (slow ticks, not in MIG mode): % of SMs each pid kept busy since the last read.
    process_util: dict[int, int] | None = None
    job_util: dict[int, int] | None = None  # % of the GPU's (or its instance's) SMs busy per portal job id
    # The processes of no portal job together: (MiB, SM % or None where not read); None where the process listing
    # may not show everything on the GPU (workers/jobmem.py).
    others: tuple[int, int | None] | None = None
    # The same per owner uid (set with `others`): {uid: (MiB, SM % or None)}.
    others_by_uid: dict[int, tuple[int, int | None]] | None = None


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from a source of GPU telemetry (NVML on real nodes, a simulation elsewhere)."""

    def discover(self) -> list[GpuInfo]:
        """The GPUs of this node, in index order."""
        ...

    def sample(self, now: float) -> list[GpuSample]:
        """One reading of every discovered GPU, stamped `now` (epoch seconds). Never raises for one bad GPU."""
        ...

    def close(self) -> None:
        """Release the backend's resources; idempotent."""
        ...


@runtime_checkable
class LayoutRefresh(Protocol):
    """A backend whose GPUs' MIG layout can change under a running agent (an admin's mig-parted)."""

    def refresh_layout(self) -> bool:
        """Read each GPU's MIG mode and instances again; `discover()` returns them from now on. Whether anything
        changed. A GPU whose reading fails keeps the layout it had: a passing error is not a new layout."""
        ...


def _round_or_none(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def sample_to_row(sample: GpuSample) -> list[Any]:
    """The compact positional form of one sample (see the module docstring for the columns)."""
    row: list[Any] = [
        sample.uuid,
        sample.utilization_pct,
        sample.memory_used_mib,
        sample.memory_total_mib,
        sample.temperature_c,
        _round_or_none(sample.power_w, 1),
        sample.sm_clock_mhz,
        _round_or_none(sample.tensor_active, 3),
    ]
    extra: dict[str, Any] = {}
    if sample.processes is not None:
        proc_busy = sample.process_util or {}
        extra["p"] = [[pid, mib] + ([proc_busy[pid]] if pid in proc_busy else []) for pid, mib in sample.processes]
    # Only problems travel: None ("not readable") and all-clear values decode back to HEALTH_OK defaults.
    health = {k: v for k, v in sample.health.items() if v is not None and HEALTH_OK.get(k) != v}
    if health:
        extra["h"] = health
    counters = [sample.counters.get(k) for k in COUNTER_KEYS]
    while counters and counters[-1] is None:
        counters.pop()
    if counters:
        extra["x"] = counters
    if sample.mig_memory:
        # [uuid, MiB], or [uuid, MiB, SM %] where the instance's SM activity was read (GPM).
        mig_busy = sample.mig_util or {}
        extra["m"] = [
            [uuid, mib] + ([mig_busy[uuid]] if uuid in mig_busy else []) for uuid, mib in sample.mig_memory.items()
        ]
    if sample.job_memory:
        job_busy = sample.job_util or {}
        extra["j"] = [
            [job_id, mib] + ([job_busy[job_id]] if job_id in job_busy else [])
            for job_id, mib in sample.job_memory.items()
        ]
    if sample.others is not None:
        mib, busy = sample.others
        extra["o"] = [mib] if busy is None else [mib, busy]
    if sample.others_by_uid is not None:
        extra["ou"] = [
            [uid, mib] + ([] if busy is None else [busy]) for uid, (mib, busy) in sorted(sample.others_by_uid.items())
        ]
    if sample.error:
        extra["e"] = sample.error
    if extra:
        row.append(extra)
    return row


def row_to_sample(row: list[Any], ts: float) -> GpuSample:
    """Inverse of `sample_to_row`; `ts` comes from the enclosing message."""
    if len(row) not in (len(ROW_FIELDS), len(ROW_FIELDS) + 1):
        raise ValueError(f"telemetry row has {len(row)} columns, expected {len(ROW_FIELDS)} or one more")
    uuid, util, mem, mem_total, temp, power, sm, tensor = row[: len(ROW_FIELDS)]
    extra: dict[str, Any] = row[len(ROW_FIELDS)] if len(row) > len(ROW_FIELDS) else {}
    procs = extra.get("p")
    health = dict(HEALTH_OK)
    health.update(extra.get("h", {}))
    return GpuSample(
        uuid=uuid,
        ts=ts,
        utilization_pct=util,
        memory_used_mib=mem,
        memory_total_mib=mem_total,
        temperature_c=temp,
        power_w=power,
        sm_clock_mhz=sm,
        tensor_active=tensor,
        processes=None if procs is None else [(int(p[0]), int(p[1])) for p in procs],
        health=health,
        error=extra.get("e"),
        counters={k: v for k, v in zip(COUNTER_KEYS, extra.get("x", []), strict=False) if v is not None},
        mig_memory={str(m[0]): int(m[1]) for m in extra["m"]} if "m" in extra else None,
        mig_util=({str(m[0]): int(m[2]) for m in extra["m"] if len(m) > 2} or None) if "m" in extra else None,
        job_memory={int(j[0]): int(j[1]) for j in extra["j"]} if "j" in extra else None,
        process_util=({int(p[0]): int(p[2]) for p in procs if len(p) > 2} or None) if procs is not None else None,
        job_util=({int(j[0]): int(j[2]) for j in extra["j"] if len(j) > 2} or None) if "j" in extra else None,
        others=(int(extra["o"][0]), int(extra["o"][1]) if len(extra["o"]) > 1 else None) if "o" in extra else None,
        others_by_uid=(
            {int(o[0]): (int(o[1]), int(o[2]) if len(o) > 2 else None) for o in extra["ou"]} if "ou" in extra else None
        ),
    )


def build_message(node: str, samples: list[GpuSample], *, ts: float, seq: int) -> dict[str, Any]:
    """The per-tick telemetry message of a node (JSON-able; see the module docstring)."""
    return {
        "type": MESSAGE_TYPE,
        "v": MESSAGE_VERSION,
        "node": node,
        "ts": round(ts, 3),
        "seq": seq,
        "f": list(ROW_FIELDS),
        "g": [sample_to_row(s) for s in samples],
    }


def parse_message(message: dict[str, Any]) -> tuple[str, float, int, list[GpuSample]]:
    """(node, ts, seq, samples) from a telemetry message; ValueError on a type or version this code cannot read."""
    if message.get("type") != MESSAGE_TYPE or message.get("v") != MESSAGE_VERSION:
        raise ValueError(
            f"not a v{MESSAGE_VERSION} telemetry message: type={message.get('type')!r} v={message.get('v')!r}"
        )
    if tuple(message.get("f", ROW_FIELDS)) != ROW_FIELDS:
        raise ValueError(f"unexpected telemetry columns {message.get('f')!r}")
    ts = float(message["ts"])
    return message["node"], ts, int(message["seq"]), [row_to_sample(r, ts) for r in message["g"]]
