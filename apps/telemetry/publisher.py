"""The fleet publisher: once a second, every GPU's latest sample merged with its state, PUBLISHed as one JSON
snapshot on `fleet:snapshots` (contract: apps/telemetry/keys.py, README.md) for the websocket fan-out.

One process for the whole installation (`manage.py fleet_publisher`, a launcher service). Per tick: one HGETALL
of `fleet:latest`, one call of `gpu_holders()`, one pipeline (INCR seq, PUBLISH, SET last); while some GPU is in
use outside the portal, one round trip and one query more (whose processes; released just now?). The GPU directory
(which GPUs exist, their node, status) is re-read from the database every `directory_every_s` seconds, not every
tick. Ticks are drift-free on the monotonic clock; a tick that fell a whole period behind is skipped, not
burst-published.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections

from apps.core.redis import get_redis
from apps.fleet.models import Gpu, Node
from apps.fleet.selectors import gpu_holders, gpu_parts, part_label
from apps.identity.selectors import unix_uids
from apps.telemetry import keys
from apps.telemetry.jobmem import job_memory_readings, owner_readings, reservation_users, running_jobs_in
from apps.telemetry.outside import outside_use
from apps.telemetry.selectors import all_latest_samples, is_stale, other_holders_uids

logger = logging.getLogger(__name__)

_METRICS = ("util", "mem_used", "mem_total", "temp", "power", "sm_clock", "tensor", "ts")


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat()


class FleetPublisher:
    def __init__(self, *, period_s: float = 1.0, directory_every_s: float = 2.0) -> None:
        self.period_s = period_s
        self.directory_every_s = directory_every_s
        self.redis = get_redis()
        self._directory: list[dict[str, Any]] = []
        self._parts: dict[str, list[dict[str, Any]]] = {}
        self._nodes: list[keys.SnapshotNode] = []
        self._directory_at = -math.inf
        self.published = 0
        self.failures = 0

    def refresh_directory(self) -> None:
        close_old_connections()
        rows: Any = (
            Gpu.objects.filter(retired_at__isnull=True)
            .order_by("node__name", "index")
            .values("id", "uuid", "index", "status", "model__name", "node__name", "node__status", "memory_mib")
        )
        self._directory = list(rows)
        self._parts = parts_by_uuid({r["id"]: r["uuid"] for r in self._directory})
        self._nodes = [
            {"name": n["name"], "status": n["status"], "last_heartbeat": _iso(n["last_heartbeat"])}
            for n in Node.objects.order_by("name").values("name", "status", "last_heartbeat")
        ]
        self._directory_at = time.monotonic()

    def build(self, *, now: float | None = None) -> keys.Snapshot:
        now = time.time() if now is None else now
        if time.monotonic() - self._directory_at >= self.directory_every_s:
            self.refresh_directory()
        latest = all_latest_samples()
        holders = gpu_holders()
        share_used, share_busy = share_job_readings(self._parts, holders, now=now)
        gpus: list[keys.SnapshotGpu] = []
        for row in self._directory:
            sample = latest.get(row["uuid"])
            entry: dict[str, Any] = {
                "uuid": row["uuid"],
                "node": row["node__name"],
                "index": row["index"],
                "model": row["model__name"],
            }
            for metric in _METRICS:
                entry[metric] = None if sample is None else sample.get(metric)
            if entry["mem_total"] is None:
                entry["mem_total"] = row["memory_mib"]
            entry["status"] = row["status"]
            entry["node_status"] = row["node__status"]
            entry["stale"] = is_stale(sample, now=now)
            entry["holder"] = holders.get(row["uuid"])
            parts = self._parts.get(row["uuid"])
            if parts:
                add_parts(entry, parts, holders, sample, share_used, share_busy)
            gpus.append(entry)  # type: ignore[arg-type]
        self._mark_outside(gpus, now=now)
        return {
            "type": "fleet",
            "ts": datetime.fromtimestamp(now, tz=UTC).isoformat(),
            "seq": int(self.redis.incr(keys.SNAPSHOT_SEQ)),
            "gpus": gpus,
            "nodes": list(self._nodes),
        }

    def _mark_outside(self, gpus: list[keys.SnapshotGpu], *, now: float) -> None:
        """Set `outside` (keys.SnapshotGpu) on the whole GPUs in use outside the portal (apps.telemetry.outside)."""
        found = {
            g["uuid"]: int(g.get("mem_used") or 0)
            for g in gpus
            if g.get("holder") is None
            and "parts" not in g
            and not g["stale"]
            and (g.get("mem_used") or 0) >= keys.OUTSIDE_USE_MIB
        }
        if not found:
            return
        ids = {row["uuid"]: int(row["id"]) for row in self._directory if row["uuid"] in found}
        outside = outside_use({uuid: (ids[uuid], mib) for uuid, mib in found.items()}, now=now)
        for g in gpus:
            if g["uuid"] in outside:
                g["outside"] = outside[g["uuid"]]

    def publish_once(self, *, now: float | None = None) -> keys.Snapshot:
        snapshot = self.build(now=now)
        body = json.dumps(snapshot, separators=(",", ":"))
        pipe = self.redis.pipeline(transaction=False)
        pipe.publish(keys.SNAPSHOTS_CHANNEL, body)
        pipe.set(keys.SNAPSHOT_LAST, body, ex=10)
        pipe.execute()
        self.published += 1
        return snapshot

    def run(self, stop: threading.Event) -> None:
        start = time.monotonic()
        k = 0
        while not stop.is_set():
            due = start + k * self.period_s
            delay = due - time.monotonic()
            if delay > 0:
                if stop.wait(delay):
                    break
            elif -delay >= self.period_s:
                k = max(k + 1, math.ceil((time.monotonic() - start) / self.period_s))
                continue
            try:
                self.publish_once()
            except Exception:  # Redis or the database restarting: log once in a while, keep the beat
                self.failures += 1
                if self.failures == 1 or self.failures % 60 == 0:
                    logger.exception("publishing the fleet snapshot failed (%d failures)", self.failures)
            k += 1


def add_parts(
    entry: dict[str, Any],
    parts: list[dict[str, Any]],
    holders: dict[str, dict[str, Any]],
    sample: keys.LatestSample | None,
    share_used: Mapping[str, int] | None = None,
    share_busy: Mapping[str, int] | None = None,
) -> None:
    """Set a snapshot entry's `holder` (one per held part) and `parts` (keys.SnapshotGpu) from the GPU's parts
    (`parts_by_uuid`), who holds what, and its latest sample (what each MIG instance uses, while fresh);
    `share_used` and `share_busy` (`share_job_readings`) are what the job on each share uses and the % of SMs its
    processes keep busy."""
    used = {} if sample is None or entry.get("stale") else dict(sample.get("mig_mem", {}))
    used.update(share_used or {})
    held = [
        {
            **holders[p["uuid"]],
            "part": p["label"],
            "part_uuid": p["uuid"],
            "mem": p["memory_mib"],
            "used": used.get(p["uuid"]),
        }
        for p in parts
        if p["uuid"] in holders
    ]
    entry["holder"] = _one_per_holder(held, parts, len(parts)) or None
    entry["parts"] = {"kind": parts[0]["kind"], "total": len(parts), "free": len(parts) - len(held)}
    in_use = {p["uuid"]: used[p["uuid"]] for p in parts if p["uuid"] in used}
    if in_use:  # every instance's reading, held or not (the GPU page lists them all)
        entry["parts"]["used"] = in_use
    busy = {} if sample is None or entry.get("stale") else dict(sample.get("mig_util", {}))
    busy.update(share_busy or {})
    # Each instance's SM activity where GPM gives it, each held share's job's where its node reads it.
    part_busy = {p["uuid"]: busy[p["uuid"]] for p in parts if p["uuid"] in busy}
    if part_busy:
        entry["parts"]["busy"] = part_busy


def _one_per_holder(held: list[dict[str, Any]], parts: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    """A job or booking that holds several shares of one GPU (half of a GPU split in four) is one holder: its
    shares named together ("shares 1-2/4"), their memory added, and its job's reading once (share_job_readings puts
    it on the first of them), so it is read against all the memory it was given."""
    index = {p["uuid"]: p.get("index", 0) for p in parts if p["kind"] == "share"}
    out: list[dict[str, Any]] = []
    taken: dict[tuple[Any, Any], list[int]] = {}  # (kind, id) -> the shares' indexes
    first: dict[tuple[Any, Any], dict[str, Any]] = {}
    for h in held:
        key = (h.get("kind"), h.get("id"))
        if h["part_uuid"] not in index or h.get("id") is None:  # a MIG instance is always its own
            out.append(h)
            continue
        if key not in first:
            first[key] = h
            taken[key] = [index[h["part_uuid"]]]
            out.append(h)
            continue
        into = first[key]
        taken[key].append(index[h["part_uuid"]])
        into["mem"] = (into.get("mem") or 0) + (h.get("mem") or 0)
        if h.get("used") is not None:
            into["used"] = (into.get("used") or 0) + h["used"]
    for key, indexes in taken.items():
        if len(indexes) == total and total > 1:  # a whole-GPU job or booking of a shared GPU
            first[key]["part"] = f"all {total} shares"
        elif len(indexes) > 1:
            indexes.sort()
            if indexes == list(range(indexes[0], indexes[-1] + 1)):
                which = f"{indexes[0] + 1}-{indexes[-1] + 1}"
            else:
                which = ", ".join(str(i + 1) for i in indexes)
            first[key]["part"] = f"shares {which}/{total}"
    return out


def share_job_readings(
    parts: Mapping[str, list[dict[str, Any]]], holders: Mapping[str, dict[str, Any]], *, now: float
) -> tuple[dict[str, int], dict[str, int]]:
    """What the jobs on each share use now and the % of SMs their processes keep busy (each by the share's uuid),
    from their node's attribution of the GPU's processes (apps.telemetry.jobmem): a share has no reading of its own.
    A share held by a reservation shows the jobs running inside it, and what the processes of no job use there
    less its neighbours' (`reservations_own_work`). One Redis round trip, plus one query while a reservation
    holds a share (and two queries and a round trip more while two hold shares of one GPU)."""
    wanted: dict[tuple[int, str], str] = {}  # (job id, GPU uuid) -> the share shown
    reserved: dict[int, list[tuple[str, str]]] = {}  # reservation id -> [(GPU uuid, share uuid)]
    for gpu_uuid, gpu_parts_ in parts.items():
        for p in gpu_parts_:
            holder = holders.get(p["uuid"])
            if p["kind"] != "share" or holder is None:
                continue
            if holder["kind"] == "job":
                wanted.setdefault((int(holder["id"]), gpu_uuid), p["uuid"])
            else:
                reserved.setdefault(int(holder["id"]), []).append((gpu_uuid, p["uuid"]))
    for reservation_id, job_id in running_jobs_in(reserved):
        for gpu_uuid, share in reserved[reservation_id]:
            # A job's reading is per GPU: with two shares of one GPU in one reservation, the first one shows it.
            wanted.setdefault((job_id, gpu_uuid), share)
    # The only reservation on a GPU also shows what no job's processes use there: its holder's own work; several
    # reservations each show it less the others' uids' work (reservations_own_work).
    reservations_on: dict[str, list[tuple[int, str]]] = {}
    for reservation_id, held in reserved.items():
        for gpu_uuid, share in held:
            reservations_on.setdefault(gpu_uuid, []).append((reservation_id, share))
    together: dict[str, list[tuple[int, str]]] = {}
    for gpu_uuid, held_here in reservations_on.items():
        if len({rid for rid, _ in held_here}) == 1:
            wanted.setdefault((keys.OTHERS_JOB_ID, gpu_uuid), held_here[0][1])
        else:
            together[gpu_uuid] = held_here
    out: dict[str, int] = {}
    busy: dict[str, int] = {}
    for share, (used, pct) in reservations_own_work(together, now=now).items():
        out[share] = used
        if pct is not None:
            busy[share] = pct
    for pair, reading in job_memory_readings(wanted).items():
        if reading.fresh(now):
            share = wanted[pair]
            out[share] = out.get(share, 0) + reading.used_mib
            if reading.busy_pct is not None:
                busy[share] = min(100, busy.get(share, 0) + reading.busy_pct)
    return out, busy


def reservations_own_work(
    on_gpu: Mapping[str, list[tuple[int, str]]], *, now: float
) -> dict[str, tuple[int, int | None]]:
    """{share uuid: (MiB, SM % or None)}: for each GPU (uuid) held by several reservations (`on_gpu`: its
    [(reservation id, share uuid)]), what is each reservation's own there now, on its first share: what the
    processes of no job use, less what the processes of the other holders' uids use by the same listing (an owner
    missing from it ran nothing then). Nothing for a reservation beside a holder whose uid is not known: whose
    processes are whose cannot be told (apps.efficiency and billing judge it the same way)."""
    if not on_gpu:
        return {}
    user_of = reservation_users({rid for held in on_gpu.values() for rid, _ in held})
    uids = unix_uids(set(user_of.values()))
    mine: dict[tuple[str, int], tuple[str, frozenset[int]]] = {}
    for gpu_uuid, held in on_gpu.items():
        first: dict[int, str] = {}
        for rid, share in held:
            first.setdefault(rid, share)
        for rid, share in first.items():
            others = [user_of.get(r) for r in first if r != rid]
            group = other_holders_uids(user_of.get(rid), others, uids)
            if group is not None:
                mine[(gpu_uuid, rid)] = (share, group)
    totals = job_memory_readings((keys.OTHERS_JOB_ID, gpu_uuid) for gpu_uuid, _ in mine)
    owners = owner_readings((uid, gpu_uuid) for (gpu_uuid, _), (_, group) in mine.items() for uid in group)
    out: dict[str, tuple[int, int | None]] = {}
    for (gpu_uuid, _), (share, group) in mine.items():
        total = totals.get((keys.OTHERS_JOB_ID, gpu_uuid))
        if total is None or not total.fresh(now):
            continue
        theirs = [r for uid in group if (r := owners.get((uid, gpu_uuid))) is not None and r.ts == total.ts]
        used = max(0, total.used_mib - sum(r.used_mib for r in theirs))
        pct = None if total.busy_pct is None else max(0, total.busy_pct - sum(r.busy_pct or 0 for r in theirs))
        out[share] = (used, pct)
    return out


def parts_by_uuid(uuid_of: dict[int, str]) -> dict[str, list[dict[str, Any]]]:
    """The live MIG instances and shares of each GPU (`uuid_of`: GPU id -> uuid), by the GPU's uuid, with a label
    for the Fleet page."""
    out: dict[str, list[dict[str, Any]]] = {}
    for gpu_id, parts in gpu_parts(gpu_ids=list(uuid_of)).items():
        for p in parts:
            out.setdefault(uuid_of[gpu_id], []).append(
                {
                    "uuid": p.uuid,
                    "kind": p.kind,
                    "index": p.index,
                    "label": part_label(p, len(parts)),
                    "memory_mib": p.memory_mib,
                }
            )
    return out
