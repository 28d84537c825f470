"""Agent -> portal messages: their shapes and strict validation (plain Python, no database).

Every message is one JSON object passed as the single argument of a Celery task on queue `control`
(`fleet.register`, `fleet.heartbeat`, `fleet.probe_result`, `telemetry.ingest`) and carries `node` and `token`.
A GPU node runs users' code, so nothing in a message is trusted: every field is type- and range-checked here before
any service sees it, and a bad message is refused as a whole with a reason code (counted for /metrics and logged),
never half-applied. The node's identity and token are checked afterwards, against the database (apps.fleet.auth).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from workers.gpu.mig import COMPUTE_SLICES, MigDevice

NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
GPU_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,95}$")
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
TOKEN_MAX_LEN = 200
MAX_GPUS_PER_NODE = 64
MAX_PROBE_BYTES = 16_384

# Physical bounds, generous on purpose: a reading outside them is a broken sensor or a forged message.
UTIL_RANGE = (0, 100)
MEM_MIB_RANGE = (0, 4 * 1024 * 1024)  # 4 TiB
TEMP_RANGE = (-40, 150)
POWER_RANGE = (0.0, 5000.0)
SM_CLOCK_RANGE = (0, 10_000)
TENSOR_RANGE = (0.0, 1.0)


class MessageRejected(Exception):
    """A message the portal refuses; `reason` is a short code for counters and logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _require(cond: bool, reason: str, detail: str) -> None:
    if not cond:
        raise MessageRejected(reason, detail)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)) and math.isfinite(value)


def check_int(value: Any, name: str, lo: int, hi: int, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    _require(_is_int(value), "malformed", f"{name} must be an integer")
    _require(lo <= value <= hi, "out_of_range", f"{name}={value} outside {lo}..{hi}")
    return int(value)


def check_float(value: Any, name: str, lo: float, hi: float, *, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    _require(_is_num(value), "malformed", f"{name} must be a finite number")
    _require(lo <= value <= hi, "out_of_range", f"{name}={value} outside {lo}..{hi}")
    return float(value)


def check_str(
    value: Any, name: str, *, max_len: int, pattern: re.Pattern[str] | None = None, blank: bool = False
) -> str:
    if value is None and blank:
        return ""
    _require(isinstance(value, str), "malformed", f"{name} must be a string")
    _require(blank or bool(value), "malformed", f"{name} is empty")
    _require(len(value) <= max_len, "malformed", f"{name} longer than {max_len}")
    if pattern is not None and value:
        _require(bool(pattern.match(value)), "malformed", f"{name} has unexpected characters")
    return str(value)


@dataclass(frozen=True)
class Envelope:
    """What every agent message carries."""

    node: str
    token: str
    ts: float | None


def check_envelope(payload: Any) -> Envelope:
    _require(isinstance(payload, dict), "malformed", "message is not a JSON object")
    node = check_str(payload.get("node"), "node", max_len=100, pattern=NODE_NAME_RE)
    token = check_str(payload.get("token"), "token", max_len=TOKEN_MAX_LEN)
    ts = payload.get("ts")
    ts_value = check_float(ts, "ts", 0.0, 1e11, nullable=True)
    return Envelope(node=node, token=token, ts=ts_value)


@dataclass(frozen=True)
class GpuReport:
    """One GPU as the agent registers it."""

    uuid: str
    index: int
    model: str
    name: str
    memory_mib: int
    mig_mode: bool
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class Registration:
    envelope: Envelope
    gpus: list[GpuReport]
    agent_version: str
    driver_version: str
    hostname: str
    backend: str


def check_registration(payload: Any) -> Registration:
    env = check_envelope(payload)
    gpus_raw = payload.get("gpus")
    _require(isinstance(gpus_raw, list), "malformed", "gpus must be a list")
    _require(len(gpus_raw) <= MAX_GPUS_PER_NODE, "out_of_range", f"more than {MAX_GPUS_PER_NODE} GPUs")
    gpus: list[GpuReport] = []
    for i, g in enumerate(gpus_raw):
        _require(isinstance(g, dict), "malformed", f"gpus[{i}] is not an object")
        gpus.append(
            GpuReport(
                uuid=check_str(g.get("uuid"), f"gpus[{i}].uuid", max_len=96, pattern=GPU_UUID_RE),
                index=check_int(g.get("index"), f"gpus[{i}].index", 0, 255),  # type: ignore[arg-type]
                model=check_str(g.get("model"), f"gpus[{i}].model", max_len=64, pattern=MODEL_RE),
                name=check_str(g.get("name"), f"gpus[{i}].name", max_len=120, blank=True),
                memory_mib=check_int(g.get("memory_mib"), f"gpus[{i}].memory_mib", 1, MEM_MIB_RANGE[1]),  # type: ignore[arg-type]
                mig_mode=_check_bool(g.get("mig_mode", False), f"gpus[{i}].mig_mode"),
                mig_devices=_check_mig_devices(g.get("mig_devices", []), f"gpus[{i}].mig_devices"),
            )
        )
    _require(len({g.uuid for g in gpus}) == len(gpus), "malformed", "duplicate GPU uuid")
    _require(len({g.index for g in gpus}) == len(gpus), "malformed", "duplicate GPU index")
    backend = check_str(payload.get("backend"), "backend", max_len=16, blank=True)
    _require(backend in {"", "nvml", "simulated"}, "malformed", "backend must be nvml or simulated")
    return Registration(
        envelope=env,
        gpus=gpus,
        agent_version=check_str(payload.get("agent_version"), "agent_version", max_len=32, blank=True),
        driver_version=check_str(payload.get("driver_version"), "driver_version", max_len=64, blank=True),
        hostname=check_str(payload.get("hostname"), "hostname", max_len=255, blank=True),
        backend=backend,
    )


_MIG_PROFILE_RE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb$")  # "1c.3g.40gb": a compute instance


def _check_mig_devices(value: Any, name: str) -> tuple[MigDevice, ...]:
    """A GPU's MIG instances: at most 7 (one per compute slice), each with a `MIG-` uuid, a profile name, its
    memory and its GPU instance id."""
    _require(isinstance(value, list), "malformed", f"{name} must be a list")
    _require(len(value) <= COMPUTE_SLICES, "out_of_range", f"{name}: more than {COMPUTE_SLICES} instances")
    out: list[MigDevice] = []
    for i, d in enumerate(value):
        _require(isinstance(d, dict), "malformed", f"{name}[{i}] is not an object")
        uuid = check_str(d.get("uuid"), f"{name}[{i}].uuid", max_len=96, pattern=GPU_UUID_RE)
        _require(uuid.startswith("MIG-"), "malformed", f"{name}[{i}].uuid must start with MIG-")
        out.append(
            MigDevice(
                uuid=uuid,
                profile=check_str(d.get("profile"), f"{name}[{i}].profile", max_len=32, pattern=_MIG_PROFILE_RE),
                memory_mib=check_int(d.get("memory_mib"), f"{name}[{i}].memory_mib", 1, MEM_MIB_RANGE[1]),  # type: ignore[arg-type]
                gi_id=check_int(d.get("gi_id"), f"{name}[{i}].gi_id", 0, 255),  # type: ignore[arg-type]
            )
        )
    _require(len({d.uuid for d in out}) == len(out), "malformed", f"{name}: duplicate uuid")
    return tuple(out)


def _check_bool(value: Any, name: str) -> bool:
    _require(isinstance(value, bool), "malformed", f"{name} must be true or false")
    return bool(value)


@dataclass(frozen=True)
class Heartbeat:
    envelope: Envelope
    agent_version: str
    holds: int


def check_heartbeat(payload: Any) -> Heartbeat:
    env = check_envelope(payload)
    return Heartbeat(
        envelope=env,
        agent_version=check_str(payload.get("agent_version"), "agent_version", max_len=32, blank=True),
        holds=check_int(payload.get("holds", 0), "holds", 0, 100_000) or 0,
    )


@dataclass(frozen=True)
class ProbeReport:
    envelope: Envelope
    gpu_uuid: str
    result: dict[str, Any] | None
    error: str
    degraded: bool


def check_probe_result(payload: Any) -> ProbeReport:
    import json

    env = check_envelope(payload)
    uuid = check_str(payload.get("gpu_uuid"), "gpu_uuid", max_len=96, pattern=GPU_UUID_RE)
    result = payload.get("result")
    error = check_str(payload.get("error"), "error", max_len=2000, blank=True)
    _require(result is None or isinstance(result, dict), "malformed", "result must be an object or null")
    _require(result is not None or bool(error), "malformed", "a probe report needs a result or an error")
    degraded = False
    if result is not None:
        _require(len(json.dumps(result)) <= MAX_PROBE_BYTES, "out_of_range", "probe result too large")
        degraded = _check_bool(result.get("degraded", False), "result.degraded")
    return ProbeReport(envelope=env, gpu_uuid=uuid, result=result, error=error, degraded=degraded)


# --- Telemetry -----------------------------------------------------------------------------------------------

# workers.gpu.base.ROW_FIELDS, v1; repeated (not imported) so the portal does not depend on the agent's code base.
TELEMETRY_FIELDS: tuple[str, ...] = ("uuid", "util", "mem", "mem_total", "temp", "power", "sm", "tensor")


@dataclass(frozen=True)
class TelemetryRow:
    uuid: str
    util: int | None
    mem: int | None
    mem_total: int | None
    temp: int | None
    power: float | None
    sm: int | None
    tensor: float | None
    lost: bool = False
    # Device counters for /metrics: the `"x"` positions named by COUNTER_KEYS (ptx/prx in KB/s) plus the health counters
    # `last_xid`, `remap_cor`, `remap_unc`, `remap_fail` (0/1); only those the row carries, each an int >= 0.
    counters: dict[str, int] = field(default_factory=dict)
    # MIG mode: memory used (MiB) per MIG instance uuid, from the `"m"` list; empty when the row carries none.
    mig_memory: dict[str, int] = field(default_factory=dict)
    # MIG mode on a GPU with GPM: % of each instance's SMs busy (the `"m"` entries' third element); empty when none.
    mig_util: dict[str, int] = field(default_factory=dict)
    # Memory used (MiB) per portal job id on this GPU, from the `"j"` list (workers/jobmem.py); empty when none.
    job_memory: dict[int, int] = field(default_factory=dict)
    # % of SMs busy per portal job id (the `"j"` entries' third element: its processes', or its MIG instance's).
    job_util: dict[int, int] = field(default_factory=dict)
    # What the processes of no portal job use together (the `"o"` list: MiB, SM % where read); None when not sent.
    others_mem: int | None = None
    others_util: int | None = None
    # The same per owner uid (the `"ou"` list): {uid: (MiB, SM % or None)}; None when not sent.
    others_by_uid: dict[int, tuple[int, int | None]] | None = None


# A GPU has at most 7 MIG instances today; the bound keeps a broken agent from growing the latest sample.
MAX_MIG_INSTANCES = 16


def _mig_memory(extra: dict[str, Any], mem_total: int | None) -> tuple[dict[str, int], dict[str, int]]:
    """The row's per-instance memory, and SM activity where an entry has it (`[uuid, MiB]` or `[uuid, MiB, %]`).
    Like the counters, an entry that is not that shape with sane values is left out alone (a bad % alone drops only
    the %), and so is the whole list when it is not a list."""
    raw = extra.get("m", [])
    out: dict[str, int] = {}
    busy: dict[str, int] = {}
    if not isinstance(raw, list):
        return out, busy
    limit = MEM_MIB_RANGE[1] if mem_total is None else mem_total
    for item in raw[:MAX_MIG_INSTANCES]:
        if not (isinstance(item, list) and len(item) in (2, 3)):
            continue
        uuid, mib = item[0], item[1]
        if not (isinstance(uuid, str) and GPU_UUID_RE.match(uuid)):
            continue
        if isinstance(mib, int) and not isinstance(mib, bool) and 0 <= mib <= limit:
            out[uuid] = mib
            pct = item[2] if len(item) == 3 else None
            if isinstance(pct, int) and not isinstance(pct, bool) and UTIL_RANGE[0] <= pct <= UTIL_RANGE[1]:
                busy[uuid] = pct
    return out, busy


# Jobs on one GPU: its shares (at most 16, apps.fleet.devices.MAX_SHARES) plus room for jobs that just ended.
MAX_JOBS_PER_GPU = 32


def _job_memory(extra: dict[str, Any], mem_total: int | None) -> tuple[dict[int, int], dict[int, int]]:
    """The row's per-job memory and SM activity, checked like `_mig_memory`: `[job_id, MiB]` or `[job_id, MiB,
    SM %]` entries, a bad one left out alone (a bad % drops the % alone)."""
    raw = extra.get("j", [])
    out: dict[int, int] = {}
    busy: dict[int, int] = {}
    if not isinstance(raw, list):
        return out, busy
    limit = MEM_MIB_RANGE[1] if mem_total is None else mem_total
    for item in raw[:MAX_JOBS_PER_GPU]:
        if not (isinstance(item, list) and len(item) in (2, 3)):
            continue
        job_id, mib = item[0], item[1]
        if not (isinstance(job_id, int) and not isinstance(job_id, bool) and 0 < job_id < 2**63):
            continue
        if isinstance(mib, int) and not isinstance(mib, bool) and 0 <= mib <= limit:
            out[job_id] = mib
            pct = item[2] if len(item) == 3 else None
            if isinstance(pct, int) and not isinstance(pct, bool) and UTIL_RANGE[0] <= pct <= UTIL_RANGE[1]:
                busy[job_id] = pct
    return out, busy


def _others(extra: dict[str, Any], mem_total: int | None) -> tuple[int | None, int | None]:
    """The row's `"o"` entry, `[MiB]` or `[MiB, SM %]`: both None when it is absent or not that shape with sane
    values; a bad % alone drops the %."""
    raw = extra.get("o")
    limit = MEM_MIB_RANGE[1] if mem_total is None else mem_total
    if not (isinstance(raw, list) and len(raw) in (1, 2)):
        return None, None
    mib = raw[0]
    if not (isinstance(mib, int) and not isinstance(mib, bool) and 0 <= mib <= limit):
        return None, None
    pct = raw[1] if len(raw) == 2 else None
    if isinstance(pct, int) and not isinstance(pct, bool) and UTIL_RANGE[0] <= pct <= UTIL_RANGE[1]:
        return mib, pct
    return mib, None


# Owners of no job's processes on one GPU: a handful of people on a GPU split in shares; the bound keeps a broken
# agent from growing the minute's accumulator.
MAX_OWNERS_PER_GPU = 32
UID_RANGE = (0, 2**32 - 2)  # (uid_t)-1 is "no uid"


def _others_by_uid(extra: dict[str, Any], mem_total: int | None) -> dict[int, tuple[int, int | None]] | None:
    """The row's `"ou"` list, `[uid, MiB]` or `[uid, MiB, SM %]` entries, checked like `_job_memory` (a bad entry
    left out alone, a bad % drops the % alone); None when the row has none or it is not a list."""
    raw = extra.get("ou")
    if not isinstance(raw, list):
        return None
    limit = MEM_MIB_RANGE[1] if mem_total is None else mem_total
    out: dict[int, tuple[int, int | None]] = {}
    for item in raw[:MAX_OWNERS_PER_GPU]:
        if not (isinstance(item, list) and len(item) in (2, 3)):
            continue
        uid, mib = item[0], item[1]
        if not (isinstance(uid, int) and not isinstance(uid, bool) and UID_RANGE[0] <= uid <= UID_RANGE[1]):
            continue
        if not (isinstance(mib, int) and not isinstance(mib, bool) and 0 <= mib <= limit):
            continue
        pct = item[2] if len(item) == 3 else None
        ok = isinstance(pct, int) and not isinstance(pct, bool) and UTIL_RANGE[0] <= pct <= UTIL_RANGE[1]
        out[uid] = (mib, pct if ok else None)
    return out


# workers.gpu.base.COUNTER_KEYS and the health keys that are counters (repeated, not imported, as above).
COUNTER_KEYS: tuple[str, ...] = ("mt", "mc", "en", "ptx", "prx", "prc", "nvl")
HEALTH_COUNTER_KEYS: tuple[str, ...] = ("last_xid", "remap_cor", "remap_unc", "remap_fail")


def _counters(extra: dict[str, Any], health: dict[str, Any]) -> dict[str, int]:
    """The row's device counters. A value that is not a non-negative integer is left out alone (a counter
    glitch must not cost the row its utilization); positions past COUNTER_KEYS are ignored (newer agents may send
    more)."""
    raw = extra.get("x", [])
    items = list(zip(COUNTER_KEYS, raw, strict=False)) if isinstance(raw, list) else []
    items += [(k, health[k]) for k in HEALTH_COUNTER_KEYS if k in health]
    out: dict[str, int] = {}
    for key, value in items:
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int) and 0 <= value < 2**63:
            out[key] = value
    return out


@dataclass
class Telemetry:
    envelope: Envelope
    ts: float
    seq: int
    rows: list[TelemetryRow]
    bad_rows: list[tuple[str, str]] = field(default_factory=list)  # (uuid or "?", reason)


def check_row(row: Any) -> TelemetryRow:
    """One GPU row of a telemetry message; MessageRejected names what is wrong."""
    n = len(TELEMETRY_FIELDS)
    _require(isinstance(row, list) and len(row) in (n, n + 1), "malformed", "row is not a list of 8 or 9 columns")
    uuid = check_str(row[0], "uuid", max_len=96, pattern=GPU_UUID_RE)
    mem_total = check_int(row[3], "mem_total", 1, MEM_MIB_RANGE[1], nullable=True)
    mem = check_int(row[2], "mem", 0, MEM_MIB_RANGE[1], nullable=True)
    if mem is not None and mem_total is not None:
        _require(mem <= mem_total, "out_of_range", f"mem {mem} above mem_total {mem_total}")
    lost = False
    counters: dict[str, int] = {}
    mig_memory: dict[str, int] = {}
    mig_util: dict[str, int] = {}
    job_memory: dict[int, int] = {}
    job_util: dict[int, int] = {}
    others_mem: int | None = None
    others_util: int | None = None
    others_by_uid: dict[int, tuple[int, int | None]] | None = None
    if len(row) == n + 1:
        extra = row[n]
        _require(isinstance(extra, dict), "malformed", "9th column must be an object")
        health = extra.get("h", {})
        _require(isinstance(health, dict), "malformed", "health must be an object")
        lost = health.get("lost") is True
        counters = _counters(extra, health)
        mig_memory, mig_util = _mig_memory(extra, mem_total)
        job_memory, job_util = _job_memory(extra, mem_total)
        others_mem, others_util = _others(extra, mem_total)
        # Per owner only beside a sound total: both come from the same complete listing.
        others_by_uid = _others_by_uid(extra, mem_total) if others_mem is not None else None
    return TelemetryRow(
        uuid=uuid,
        util=check_int(row[1], "util", *UTIL_RANGE, nullable=True),
        mem=mem,
        mem_total=mem_total,
        temp=check_int(row[4], "temp", *TEMP_RANGE, nullable=True),
        power=check_float(row[5], "power", *POWER_RANGE, nullable=True),
        sm=check_int(row[6], "sm", *SM_CLOCK_RANGE, nullable=True),
        tensor=check_float(row[7], "tensor", *TENSOR_RANGE, nullable=True),
        lost=lost,
        counters=counters,
        mig_memory=mig_memory,
        mig_util=mig_util,
        job_memory=job_memory,
        job_util=job_util,
        others_mem=others_mem,
        others_util=others_util,
        others_by_uid=others_by_uid,
    )


def check_telemetry(payload: Any) -> Telemetry:
    """A telemetry message (workers.gpu.base.build_message plus `token`). The envelope must be sound or the whole
    message is refused; a bad GPU row is dropped alone (one broken sensor must not blind the portal to the node's
    other GPUs) and listed in `bad_rows`."""
    env = check_envelope(payload)
    _require(payload.get("type") == "telemetry", "malformed", "type must be 'telemetry'")
    _require(payload.get("v") == 1, "malformed", "unsupported telemetry version")
    fields = payload.get("f", list(TELEMETRY_FIELDS))
    _require(isinstance(fields, list) and tuple(fields) == TELEMETRY_FIELDS, "malformed", "unexpected columns")
    _require(env.ts is not None, "malformed", "ts missing")
    seq = check_int(payload.get("seq"), "seq", 0, 2**53)
    rows_raw = payload.get("g")
    _require(isinstance(rows_raw, list), "malformed", "g must be a list")
    _require(len(rows_raw) <= MAX_GPUS_PER_NODE, "out_of_range", f"more than {MAX_GPUS_PER_NODE} rows")
    rows: list[TelemetryRow] = []
    bad: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in rows_raw:
        try:
            row = check_row(raw)
        except MessageRejected as exc:
            uuid = raw[0] if isinstance(raw, list) and raw and isinstance(raw[0], str) else "?"
            bad.append((uuid[:96], f"{exc.reason}: {exc.detail}"))
            continue
        if row.uuid in seen:
            bad.append((row.uuid, "malformed: duplicate uuid"))
            continue
        seen.add(row.uuid)
        rows.append(row)
    return Telemetry(envelope=env, ts=float(env.ts), seq=int(seq), rows=rows, bad_rows=bad)  # type: ignore[arg-type]
