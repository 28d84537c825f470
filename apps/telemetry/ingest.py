"""Telemetry ingest: one agent message (one node, all its GPUs, one tick) into Redis in one round trip.

The hot path of the fleet: 1,000 GPUs at 1 Hz are 125 messages a second from 8-GPU nodes. Per message: strict
validation (apps.fleet.messages), the node's token checked against its cached digest (apps.fleet.auth, no query
in the steady state), then one EVALSHA of `_SCRIPT`, which writes `fleet:latest`, the history lists, the minute
rollup accumulators and the counters atomically. No database query per GPU per second; the database sees the
minute rollups only, from `rollups.flush_rollups`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.core.redis import get_redis
from apps.fleet.auth import node_authenticate, node_identity
from apps.fleet.messages import MessageRejected, TelemetryRow, check_telemetry
from apps.telemetry import keys

logger = logging.getLogger(__name__)

# KEYS: 1 latest, 2 minute accumulator, 3 pending minutes, 4 stats, 5 node seen, 6 job memory, 7 owner memory,
#       8.. one history list per GPU.
# ARGV: 1 minute, 2 node, 3 ts, 4 history length, 5 history ttl, 6 GPU count, then 10 per GPU:
#       uuid, latest JSON, history JSON, util, mem, temp, power ('' = null), job memory and, where known, SM %
#       ("job:mib[:pct],..." or ''; the % summed per minute under `<gpu>|ju_n<job>` and `ju_s<job>`),
#       MIG instances' memory and, where read, SM % ("MIG-uuid=mib[:pct],..." or ''): kept under the parent's prefix
#       (`<gpu>|i_hi:<MIG uuid>`), so the flush takes an instance's minute only from the GPU it belongs to
#       (rollups.accumulator_instance_rows),
#       what no job's processes use per owner ("uid:mib[:pct],..." or ''): the most MiB per minute under
#       `<gpu>|o<uid>`, the % summed under `ou_s<uid>` (averaged over the `"o"` ticks: rollups.accumulator_owners),
#       and the latest per (uid, GPU) in the owner memory hash (keys.OWNER_MEMORY).
_SCRIPT = """
local roll = KEYS[2]
local n = tonumber(ARGV[6])
local hlen = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local function keep_min(f, v)
  local cur = redis.call('HGET', roll, f)
  if (not cur) or tonumber(v) < tonumber(cur) then redis.call('HSET', roll, f, v) end
end
local function keep_max(f, v)
  local cur = redis.call('HGET', roll, f)
  if (not cur) or tonumber(v) > tonumber(cur) then redis.call('HSET', roll, f, v) end
end
local latest = {}
for i = 0, n - 1 do
  local b = 7 + i * 10
  local uuid = ARGV[b]
  latest[#latest + 1] = uuid
  latest[#latest + 1] = ARGV[b + 1]
  local hk = KEYS[8 + i]
  redis.call('LPUSH', hk, ARGV[b + 2])
  redis.call('LTRIM', hk, 0, hlen - 1)
  redis.call('EXPIRE', hk, ttl)
  local p = uuid .. '|'
  redis.call('HINCRBY', roll, p .. 'n', 1)
  local u, m, t, w = ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
  if u ~= '' then
    redis.call('HINCRBY', roll, p .. 'u_n', 1)
    redis.call('HINCRBY', roll, p .. 'u_s', u)
    keep_min(p .. 'u_lo', u)
    keep_max(p .. 'u_hi', u)
  end
  if m ~= '' then
    redis.call('HINCRBY', roll, p .. 'm_n', 1)
    redis.call('HINCRBY', roll, p .. 'm_s', m)
    keep_max(p .. 'm_hi', m)
  end
  if t ~= '' then
    redis.call('HINCRBY', roll, p .. 't_n', 1)
    keep_max(p .. 't_hi', t)
  end
  if w ~= '' then
    redis.call('HINCRBY', roll, p .. 'p_n', 1)
    redis.call('HINCRBYFLOAT', roll, p .. 'p_s', w)
  end
  for job, mib, pct in string.gmatch(ARGV[b + 7], '(%d+):(%d+):?(%d*)') do
    local f = job .. '|' .. uuid
    local peak = tonumber(mib)
    local cur = redis.call('HGET', KEYS[6], f)
    local old = cur and tonumber(string.match(cur, '^[^,]*,%d+,(%d+)'))
    if old and old > peak then peak = old end
    local now = ARGV[3] .. ',' .. mib .. ',' .. peak
    if pct ~= '' then now = now .. ',' .. pct end
    redis.call('HSET', KEYS[6], f, now)
    keep_max(p .. 'j' .. job, mib)
    if pct ~= '' then
      redis.call('HINCRBY', roll, p .. 'ju_n' .. job, 1)
      redis.call('HINCRBY', roll, p .. 'ju_s' .. job, pct)
    end
  end
  for dev, mib, pct in string.gmatch(ARGV[b + 8], '([^,=]+)=(%d+):?(%d*)') do
    redis.call('HINCRBY', roll, p .. 'i_n:' .. dev, 1)
    redis.call('HINCRBY', roll, p .. 'i_s:' .. dev, mib)
    keep_max(p .. 'i_hi:' .. dev, mib)
    if pct ~= '' then
      redis.call('HINCRBY', roll, p .. 'i_un:' .. dev, 1)
      redis.call('HINCRBY', roll, p .. 'i_us:' .. dev, pct)
      keep_min(p .. 'i_ulo:' .. dev, pct)
      keep_max(p .. 'i_uhi:' .. dev, pct)
    end
  end
  for uid, mib, pct in string.gmatch(ARGV[b + 9], '(%d+):(%d+):?(%d*)') do
    keep_max(p .. 'o' .. uid, mib)
    local now = ARGV[3] .. ',' .. mib
    if pct ~= '' then
      redis.call('HINCRBY', roll, p .. 'ou_s' .. uid, pct)
      now = now .. ',' .. pct
    end
    redis.call('HSET', KEYS[7], uid .. '|' .. uuid, now)
  end
end
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(latest))
  redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
  redis.call('EXPIRE', roll, 7200)
end
redis.call('HINCRBY', KEYS[4], 'messages_accepted', 1)
redis.call('HINCRBY', KEYS[4], 'samples_accepted', n)
redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
return n
"""

_script: Any = None


def _lua() -> Any:
    global _script
    if _script is None:
        _script = get_redis().register_script(_SCRIPT)
    return _script


def record_rejection(reason: str, *, rows: int = 0, stale: bool = False) -> None:
    """Count a refused message (or refused rows) for /metrics; never raises (Redis down must not hide the log)."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        if stale:
            pipe.hincrby(keys.STATS, "messages_stale", 1)
        elif rows:
            pipe.hincrby(keys.STATS, "rows_rejected", rows)
        else:
            pipe.hincrby(keys.STATS, "messages_rejected", 1)
        pipe.hincrby(keys.STATS, f"rejected:{reason}", max(rows, 1))
        pipe.execute()
    except Exception:
        logger.debug("could not count a rejection", exc_info=True)


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected_rows: int
    stale: bool = False


@dataclass
class Prepared:
    """One message checked and turned into the arguments of one `_SCRIPT` call."""

    keys: list[str]
    argv: list[Any]
    accepted: int
    bad: list[tuple[str, str]]
    node: str
    node_id: int = 0
    newly_lost: list[str] = field(default_factory=list)  # rows flagged lost for GPUs not yet `lost` in the database


def _num(value: float | int | None) -> str:
    return "" if value is None else str(value)


def prepare(payload: Any, *, now: float) -> Prepared | None:
    """Validate and authenticate one message; None when it is stale (dropped), MessageRejected when refused."""
    msg = check_telemetry(payload)
    ident = node_authenticate(msg.envelope.node, msg.envelope.token)
    age = now - msg.ts
    if age > settings.TELEMETRY_MAX_AGE_S:
        # A backlog after an outage is not replayed (Celery's `expires` or the stream's trim drop most of it first).
        return None
    if -age > settings.TELEMETRY_MAX_SKEW_S:
        raise MessageRejected("out_of_range", f"ts {msg.ts} is {-age:.0f} s in the future")
    rows: list[TelemetryRow] = []
    bad = list(msg.bad_rows)
    for row in msg.rows:
        if row.uuid not in ident.gpus:
            # Maybe registered a moment ago through another worker process: look again (rate-limited).
            ident = node_identity(ident.name, refresh=True) or ident
            if row.uuid not in ident.gpus:
                bad.append((row.uuid, "unknown_gpu: not a GPU of this node"))
                continue
        rows.append(row)
    ts = round(msg.ts, 3)
    minute = int(ts // 60 * 60)
    argv: list[Any] = [minute, ident.name, ts, settings.TELEMETRY_HISTORY_SAMPLES, keys.HISTORY_TTL_S, len(rows)]
    redis_keys = [
        keys.LATEST,
        keys.rollup_key(minute),
        keys.ROLLUP_PENDING,
        keys.STATS,
        keys.NODE_SEEN,
        keys.JOB_MEMORY,
        keys.OWNER_MEMORY,
    ]
    for row in rows:
        ref = ident.gpus[row.uuid]
        latest = {
            "uuid": row.uuid,
            "node": ident.name,
            "index": ref.index,
            "model": ref.model,
            "util": row.util,
            "mem_used": row.mem,
            "mem_total": row.mem_total,
            "temp": row.temp,
            "power": row.power,
            "sm_clock": row.sm,
            "tensor": row.tensor,
            "ts": ts,
        }
        if row.counters:
            latest["counters"] = row.counters
        if row.mig_memory:
            latest["mig_mem"] = row.mig_memory
        if row.mig_util:
            latest["mig_util"] = row.mig_util
        argv += [
            row.uuid,
            json.dumps(latest, separators=(",", ":")),
            json.dumps([ts, row.util, row.mem, row.temp, row.power], separators=(",", ":")),
            _num(row.util),
            _num(row.mem),
            _num(row.temp),
            _num(row.power),
            _job_readings(row),
            ",".join(
                f"{uuid}={mib}" + (f":{row.mig_util[uuid]}" if uuid in row.mig_util else "")
                for uuid, mib in row.mig_memory.items()
            ),
            ",".join(
                f"{uid}:{mib}" + ("" if pct is None else f":{pct}")
                for uid, (mib, pct) in (row.others_by_uid or {}).items()
            ),
        ]
        redis_keys.append(keys.hist_key(row.uuid))
    newly_lost = [row.uuid for row in rows if row.lost and ident.gpus[row.uuid].status != "lost"]
    return Prepared(
        keys=redis_keys,
        argv=argv,
        accepted=len(rows),
        bad=bad,
        node=ident.name,
        node_id=ident.id,
        newly_lost=newly_lost,
    )


def _job_readings(row: TelemetryRow) -> str:
    """ "job:mib[:pct],...", with what no job's processes use as job `keys.OTHERS_JOB_ID` where the row says."""
    parts = [
        f"{job_id}:{mib}" + (f":{row.job_util[job_id]}" if job_id in row.job_util else "")
        for job_id, mib in row.job_memory.items()
    ]
    if row.others_mem is not None:
        pct = "" if row.others_util is None else f":{row.others_util}"
        parts.append(f"{keys.OTHERS_JOB_ID}:{row.others_mem}{pct}")
    return ",".join(parts)


def _mark_lost(prepared: Prepared) -> None:
    if prepared.newly_lost:
        from apps.fleet.services import gpus_mark_lost

        gpus_mark_lost(node_id=prepared.node_id, uuids=prepared.newly_lost)
        node_identity(prepared.node, refresh=True)


def _log_bad(prepared: Prepared) -> None:
    logger.warning("telemetry from %s: %d row(s) refused: %s", prepared.node, len(prepared.bad), prepared.bad[:3])


def telemetry_ingest(payload: Any, *, now: float | None = None) -> IngestResult:
    """Validate, authenticate and store one telemetry message. Raises MessageRejected for a refused message; drops
    (and counts) a stale one; drops a refused row alone (bad values, or a GPU that is not this node's)."""
    prepared = prepare(payload, now=time.time() if now is None else now)
    if prepared is None:
        record_rejection("stale", stale=True)
        return IngestResult(accepted=0, rejected_rows=0, stale=True)
    if prepared.bad:
        record_rejection("bad_row", rows=len(prepared.bad))
        _log_bad(prepared)
    _lua()(keys=prepared.keys, args=prepared.argv)
    _mark_lost(prepared)
    return IngestResult(accepted=prepared.accepted, rejected_rows=len(prepared.bad))


@dataclass
class BatchResult:
    messages: int = 0
    accepted_samples: int = 0
    stale: int = 0
    rejected: int = 0
    rejected_rows: int = 0


def telemetry_ingest_batch(payloads: list[Any], *, now: float | None = None) -> BatchResult:
    """Many messages in one Redis round trip: each is prepared as `telemetry_ingest` does (refusals are counted
    and logged, never raised), then every Lua call and counter goes out in one pipeline."""
    now = time.time() if now is None else now
    result = BatchResult(messages=len(payloads))
    pipe = get_redis().pipeline(transaction=False)
    script = _lua()
    counters: dict[str, int] = {}
    lost: list[Prepared] = []
    for payload in payloads:
        try:
            prepared = prepare(payload, now=now)
        except MessageRejected as exc:
            result.rejected += 1
            counters["messages_rejected"] = counters.get("messages_rejected", 0) + 1
            counters[f"rejected:{exc.reason}"] = counters.get(f"rejected:{exc.reason}", 0) + 1
            node = payload.get("node") if isinstance(payload, dict) else None
            logger.warning("telemetry from node %r refused: %s", str(node)[:100], exc)
            continue
        if prepared is None:
            result.stale += 1
            counters["messages_stale"] = counters.get("messages_stale", 0) + 1
            counters["rejected:stale"] = counters.get("rejected:stale", 0) + 1
            continue
        if prepared.bad:
            result.rejected_rows += len(prepared.bad)
            counters["rows_rejected"] = counters.get("rows_rejected", 0) + len(prepared.bad)
            counters["rejected:bad_row"] = counters.get("rejected:bad_row", 0) + len(prepared.bad)
            _log_bad(prepared)
        script(keys=prepared.keys, args=prepared.argv, client=pipe)
        result.accepted_samples += prepared.accepted
        if prepared.newly_lost:
            lost.append(prepared)
    for name, amount in counters.items():
        pipe.hincrby(keys.STATS, name, amount)
    pipe.execute()
    for prepared in lost:
        _mark_lost(prepared)
    return result
