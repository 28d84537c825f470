"""The Redis contract of live telemetry: key names, value shapes and the snapshot channel.

Writers: the portal's telemetry ingest (`apps.telemetry.ingest`, run by the Celery worker consuming `control`)
and the fleet publisher (`manage.py fleet_publisher`). Readers: the REST API, `/metrics`, the publisher, and the
websocket fan-out (`/ws/fleet/`). apps/telemetry/README.md describes the same contract in prose; change both
together and never rename a key in place (readers in other processes rely on it).

Everything here lives in the portal's Redis (settings.REDIS_URL, the broker's database). Redis may be flushed or
restarted at any time: every key is rebuilt within seconds by the agents' next messages; only the rollup minute
that was still accumulating is lost.
"""

from __future__ import annotations

import json
from typing import Any, Final, NotRequired, TypedDict

# --- Latest sample per GPU ---------------------------------------------------------------------------------
# Hash. Field: GPU uuid. Value: compact JSON `LatestSample` (below). One HSET per agent message (all GPUs of the
# node at once); one HMGET/HGETALL serves any number of GPUs. Entries are overwritten, never deleted by ingest:
# compare `ts` with the clock to tell live from stale (see STALE_AFTER_S).
LATEST = "fleet:latest"

# --- Short raw history per GPU (sparklines) ------------------------------------------------------------------
# List per GPU, newest first: `LPUSH` + `LTRIM 0 HISTORY_LEN-1`, `EXPIRE HISTORY_TTL_S` on every write (a GPU that
# stops reporting disappears). Each element is a compact JSON array `[ts, util, mem_used, temp, power]`
# (HIST_FIELDS); any element but ts may be null. Read with `LRANGE fleet:hist:<uuid> 0 N-1`.
HIST_PREFIX = "fleet:hist:"
HIST_FIELDS: tuple[str, ...] = ("ts", "util", "mem_used", "temp", "power")
HISTORY_LEN = 120  # settings.TELEMETRY_HISTORY_SAMPLES may lower or raise it; readers must not assume a length
HISTORY_TTL_S = 600

# --- Memory used per job on each GPU ----------------------------------------------------------------------------
# Hash. Field: `<job id>|<GPU uuid>` (the physical GPU whose row reported it: a MIG instance's or a share's job is
# reported by its parent). Value: `ts,used_mib,peak_mib[,sm_pct]` (ts of the last report, epoch seconds; the peak
# since the field was created; the % of SMs its processes kept busy, where the node read it). Written by ingest
# from the rows' `"j"` lists (the agent reads processes every ~10 s); `apps.telemetry.jobmem` reads it (only for a
# job's own GPUs, so a node cannot speak for another node's job), copies the peaks into
# `Job.gpu_memory_own_peak_mib` every minute and deletes fields not reported for a while.
JOB_MEMORY = "fleet:jobmem"
# What the processes of no portal job use on a GPU (the row's `"o"`) rides the job readings under job id 0, which
# no job has: per minute under `<gpu>|j0`, `ju_n0`, `ju_s0` (rollups keep it as GpuRollup.others_*). The same per
# owner uid (the row's `"ou"`) only in the minute's accumulator: `<gpu>|o<uid>` (most MiB), `ou_s<uid>` (SM % summed,
# averaged over `ju_n0`); rollups keep it as OwnerMinute for GPUs split in shares.
OTHERS_JOB_ID = 0
# Hash. Field: `<uid>|<GPU uuid>`. Value: `ts,used_mib[,sm_pct]`: what the processes of no job that uid owns used on
# the GPU at the row's last `"ou"` list (an owner missing from a later list ran nothing then: compare its ts with
# the job-0 reading's). Written by ingest; read by the fleet publisher (a reservation's own work on a GPU it shares
# with another reservation); `apps.telemetry.jobmem.flush_job_memory` deletes fields not reported for a while.
OWNER_MEMORY = "fleet:ownermem"
# A per-job reading older than this is not "now" any more (three of the agent's ~10 s process reads missed).
JOB_MEMORY_FRESH_S = 35.0

# --- Snapshots published once a second -----------------------------------------------------------------------
# Pub/sub channel. One JSON `Snapshot` message per second from `manage.py fleet_publisher`. Pub/sub has no replay:
# a subscriber that reconnects reads SNAPSHOT_LAST to have something to show at once.


def snapshots_channel_for_db(db: int) -> str:
    """Pub/sub ignores the database number, so two installations (or test runs) sharing one Redis server on
    different databases would hear each other's snapshots: the channel name carries the database."""
    return "fleet:snapshots" if db == 0 else f"fleet:snapshots:db{db}"


def _snapshots_channel() -> str:
    try:
        from django.conf import settings

        db = int(settings.REDIS.db)
    except Exception:  # outside Django (benchmarks): the default database
        db = 0
    return snapshots_channel_for_db(db)


SNAPSHOTS_CHANNEL = _snapshots_channel()
SNAPSHOT_LAST = "fleet:snapshot:last"  # string: the last published snapshot (same JSON), SET with EX 10
SNAPSHOT_SEQ = "fleet:snapshot:seq"  # INCR counter behind `seq`: monotonic across publisher restarts

# A sample older than this (seconds, by its `ts`) is stale: shown greyed out, left out of /metrics.
STALE_AFTER_S = 10.0
# A GPU nothing in the portal holds, with at least this much memory used, is in use outside the portal (a process
# started on the node by hand, or one a finished job left behind); below it, used memory is the driver's own. The
# fleet snapshots say so (SnapshotGpu.outside), the pages show what they say.
OUTSIDE_USE_MIB = 1024
# Nor is a GPU the portal released less than this ago: its latest samples may still show the job that just ended
# there (samples are a second apart; a process takes a moment to free its memory). The scheduler, the fleet
# snapshots and the GPU API apply it alike.
OUTSIDE_GRACE_S = 60.0

# --- Internal to the portal (not for other readers) -----------------------------------------------------------
# Rollup accumulators: hash per minute (`fleet:roll:<minute epoch>`), fields `<uuid>|<metric>` (see
# apps.telemetry.ingest); a sorted set of minutes that hold data, scored by the minute's epoch. A beat task
# (`telemetry.flush_rollups`) upserts closed minutes into GpuRollup and deletes them.
ROLLUP_PREFIX = "fleet:roll:"
ROLLUP_PENDING = "fleet:roll:pending"
# Hash of counters for /metrics: messages_accepted, samples_accepted, messages_stale, messages_rejected,
# rows_rejected, and `rejected:<reason>` per reason.
STATS = "fleet:stats"
# Hash: node name -> epoch of the last accepted telemetry message from that node.
NODE_SEEN = "fleet:seen"
# Stream the agents append their telemetry messages to (XADD, field "m" = the JSON message, MAXLEN ~ 20000); the
# portal's ingest consumers read it as consumer group INGEST_GROUP, in batches, without acknowledgements (a lost
# sample is replaced by the next one). Entries older than TELEMETRY_MAX_AGE_S are trimmed, never replayed.
INGEST_STREAM = "fleet:ingest"
INGEST_GROUP = "portal-ingest"


class LatestSample(TypedDict):
    """Value of one `fleet:latest` field. Units: util %, mem MiB, temp °C, power W, sm_clock MHz, tensor 0..1,
    ts epoch seconds (float, the node's clock at the sample). A metric the GPU cannot read this tick is null."""

    uuid: str
    node: str
    index: int
    model: str
    util: int | None
    mem_used: int | None
    mem_total: int | None
    temp: int | None
    power: float | None
    sm_clock: int | None
    tensor: float | None  # tensor-pipe activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE); null where unsupported
    ts: float
    # Device counters for /metrics (apps.fleet.messages.TelemetryRow.counters: mt, mc, en, ptx/prx KB/s, prc, nvl,
    # last_xid, remap_cor, remap_unc, remap_fail), only those the GPU reported; absent when it reported none.
    counters: NotRequired[dict[str, int]]
    # A GPU in MIG mode: memory used (MiB) by each MIG instance, by its `MIG-` uuid; absent otherwise.
    mig_mem: NotRequired[dict[str, int]]
    # A GPU in MIG mode with GPM (Hopper and later): % of each instance's SMs busy, by its uuid; absent otherwise.
    mig_util: NotRequired[dict[str, int]]


# Holder fields everyone may see (the fleet websocket and GET /api/v1/gpus/ alike); anything else (user,
# reservation/job id, until, future fields) only the holder's own team and admins. A whitelist, so a field the
# publisher adds later is private until someone decides otherwise. Team names are public: the Book page shows
# other teams' bookings by team name. What part of a GPU is held ("part", "mem") and the memory a MIG instance uses
# ("used") are the GPU's, as public as its profile list and its own memory reading.
PUBLIC_HOLDER_FIELDS: Final = ("kind", "team", "part", "part_uuid", "mem", "used")


class Holder(TypedDict, total=False):
    """Who holds a GPU right now (from apps.fleet.selectors.gpu_holders()); redact for viewers outside `team`."""

    kind: str  # "reservation" | "job"
    id: int
    team: str  # team slug
    team_id: int
    user: str
    until: str | None  # ISO 8601
    # On the holders of a GPU's parts in a snapshot (SnapshotGpu.holder as a list): the part, its memory, its use.
    part: str
    part_uuid: str
    mem: int
    used: int | None


class SnapshotGpu(LatestSample, total=False):
    """One GPU in a snapshot: the latest sample (metrics null when none was ever received) plus state."""

    status: str  # GPU status: ok | degraded | lost | offline
    node_status: str  # online | draining | offline
    stale: bool  # no sample in the last STALE_AFTER_S seconds
    # A GPU in MIG mode or split in shares: one holder per held part (with "part", its profile or share,
    # "part_uuid", "mem", its memory in MiB, and "used", the MiB the part's job uses now, null when unknown; a
    # holder of several shares is one entry, "shares 1-2/4", with their memory added and "part_uuid" the first),
    # and "parts": {"kind": "mig" | "share", "total": n, "free": n free now, "used": {instance uuid: MiB}
    # for every MIG instance with a fresh reading (absent when none), "busy": {part uuid: % of its SMs busy}
    # for an instance where GPM gives it and for a held share where its job's node reads per-process utilization
    # (absent otherwise)}.
    holder: Holder | list[dict[str, Any]] | None
    parts: dict[str, Any]
    # A whole GPU nothing in the portal holds (nor released in the last OUTSIDE_GRACE_S) whose fresh sample shows at
    # least OUTSIDE_USE_MIB used: {"mib": MiB used, "by": [{"user", "teams", "mib"} for a portal user's processes
    # (their Unix account), {"uid", "mib"} for a uid no portal user has]} from the node's last process listing;
    # "by" may be empty (no listing, or processes of no known owner). Absent otherwise. Redacted per viewer
    # (apps.telemetry.fanout): a name only for viewers who share a team with that user, a uid only for admins.
    outside: dict[str, Any]


class SnapshotNode(TypedDict):
    name: str
    status: str
    last_heartbeat: str | None  # ISO 8601


class Snapshot(TypedDict):
    """Message on SNAPSHOTS_CHANNEL: `{"type": "fleet", "ts": ISO-8601, "seq": n, "gpus": [...], "nodes": [...]}`.
    `gpus` lists every registered GPU (ordered by node name, index), `nodes` every node."""

    type: str
    ts: str
    seq: int
    gpus: list[SnapshotGpu]
    nodes: list[SnapshotNode]


def hist_key(uuid: str) -> str:
    return f"{HIST_PREFIX}{uuid}"


def rollup_key(minute: int) -> str:
    """Accumulator of the minute starting at `minute` (epoch seconds, a multiple of 60)."""
    return f"{ROLLUP_PREFIX}{minute}"


def decode_latest(raw: bytes | str | None) -> LatestSample | None:
    """One `fleet:latest` value, or None for a missing or unreadable one (never raises)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) and "uuid" in value else None  # type: ignore[return-value]


def decode_hist(items: Any) -> list[dict[str, Any]]:
    """`LRANGE` of a history list as dicts keyed by HIST_FIELDS, oldest first."""
    out: list[dict[str, Any]] = []
    for raw in reversed(items):
        try:
            row = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if isinstance(row, list) and len(row) == len(HIST_FIELDS):
            out.append(dict(zip(HIST_FIELDS, row, strict=True)))
    return out
