"""Telemetry ingest at fleet scale: N GPUs at 1 Hz into ONE portal process.

    DATABASE_URL=... REDIS_URL=... .venv/bin/python -m bench.fleet_ingest [--path stream|celery] [--nodes 125]
        [--gpus-per-node 8] [--seconds 30] [--warmup 8] [--heartbeat 5] [--counters]
        [--jobs-per-gpu K [--job-every N]] [--owners-per-gpu K] [--mig-per-gpu K]

What runs:
- setup (this process, Django): nodes `bench-000`... with tokens and registered GPUs (idempotent), Redis cleaned;
- the load: a separate generator process (`--generate`, no Django) that sends what 125 agents send, through the
  agent's transport (workers.transport): one telemetry message per node per second (8 GPUs each, spread evenly
  over the second, as unsynchronized agents are) plus one `fleet.heartbeat` Celery task per node every
  `--heartbeat` seconds;
- `--path stream` (the default, what agents do): telemetry is XADDed to the stream `fleet:ingest` and ONE
  `manage.py ingest_telemetry` process stores it (batches, one pipeline per batch); heartbeats go to one
  `celery -A portal worker -Q control -P solo` process, measured separately;
- `--path celery`: telemetry is one `telemetry.ingest` task per message (expires 10 s) into that ONE solo Celery
  worker, which also takes the heartbeats (solo pool: the tasks run in that one process, so its CPU time is the
  whole cost: Celery/kombu, validation, token check, the Lua call).

Reported over the measured window (after the warm-up): samples stored per second (the `fleet:stats` counter, so
only what really landed in Redis counts), messages per second, the worker's CPU time per wall second (from
/proc/<pid>/stat), CPU per message, the `control` queue's length at the end (a growing backlog means "not
sustained"), stale drops, and how old the newest sample of each GPU is at the end (p50/max).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (no psutil needed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def redis_cpu(r: Any) -> float:
    """CPU seconds the Redis server has used (user + system), from INFO."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# --- the load generator (separate process, no Django) -----------------------------------------------------------


def generate(spec_path: Path, seconds: float, heartbeat_s: float, path: str) -> None:
    from workers.transport import (
        TELEMETRY_EXPIRES_S,
        TELEMETRY_STREAM,
        TELEMETRY_STREAM_MAXLEN,
        make_celery,
        make_stream_client,
    )

    spec = json.loads(spec_path.read_text())
    nodes: list[dict[str, Any]] = spec["nodes"]
    counters = bool(spec.get("counters"))  # --counters: rows carry the device counters agents send ("x")
    jobs_per_gpu = int(spec.get("jobs_per_gpu", 0))  # --jobs-per-gpu: rows carry their jobs' memory ("j")
    job_every = max(1, int(spec.get("job_every", 10)))
    owners_per_gpu = int(spec.get("owners_per_gpu", 0))  # --owners-per-gpu: no job's processes per uid ("o", "ou")
    mig_per_gpu = int(spec.get("mig_per_gpu", 0))  # --mig-per-gpu: rows carry their MIG instances' memory ("m")
    app = make_celery(os.environ["REDIS_URL"], "bench-generator")
    stream = make_stream_client(os.environ["REDIS_URL"])
    rng = random.Random(1)
    fields = ["uuid", "util", "mem", "mem_total", "temp", "power", "sm", "tensor"]
    n = len(nodes)
    slot = 1.0 / n
    start = time.monotonic()
    seq = 0
    sent = 0
    k = 0
    hb_every = max(1, round(heartbeat_s))
    with app.producer_or_acquire() as producer:
        while time.monotonic() - start < seconds:
            tick_start = start + k
            for i, node in enumerate(nodes):
                due = tick_start + i * slot
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif -delay > 1.0:
                    continue  # fell a whole second behind: drop, as the sampler does
                now = time.time()
                rows = []
                for uuid in node["gpus"]:
                    util = rng.randrange(101)
                    rows.append(
                        [
                            uuid,
                            util,
                            1000 + util * 700,
                            81920,
                            30 + util // 3,
                            round(60 + util * 3.4, 1),
                            1410 if util else 210,
                            round(util / 250, 3),
                        ]
                    )
                    extra: dict[str, Any] = {}
                    if counters:
                        # mt, mc, en, ptx, prx, prc, nvl (workers.gpu.base.COUNTER_KEYS)
                        x = [34 + util // 3, 1593, 123_456_789 + seq * 300_000, util * 35_000, util * 117_000, 0]
                        extra["x"] = [*x, seq * util * 1_500_000]
                    if jobs_per_gpu and (seq + i) % job_every == 0:
                        # As the agent's slow tick sends them: the memory of each job on the GPU (shares of it).
                        base = 10_000 + (i * 8 + len(rows)) * jobs_per_gpu
                        extra["j"] = [[base + j, 2_000 + util * 60 + j] for j in range(jobs_per_gpu)]
                    if owners_per_gpu and (seq + i) % job_every == 0:
                        # The same slow tick: what no job's processes use, in total and per owner uid.
                        owned = [
                            [1000 + u, 1_000 + util * 20 + u, util // owners_per_gpu] for u in range(owners_per_gpu)
                        ]
                        extra["o"] = [sum(o[1] for o in owned), sum(o[2] for o in owned)]
                        extra["ou"] = owned
                    if mig_per_gpu:
                        # A GPU in MIG mode: every sample carries each instance's memory, as the agent reads it.
                        extra["m"] = [[f"MIG-{uuid[4:]}-{k}", 12 + util * 9 + k] for k in range(mig_per_gpu)]
                    if extra:
                        rows[-1].append(extra)
                message = {
                    "type": "telemetry",
                    "v": 1,
                    "node": node["name"],
                    "token": node["token"],
                    "ts": round(now, 3),
                    "seq": seq,
                    "f": fields,
                    "g": rows,
                }
                if path == "stream":
                    stream.xadd(
                        TELEMETRY_STREAM,
                        {"m": json.dumps(message, separators=(",", ":"))},
                        maxlen=TELEMETRY_STREAM_MAXLEN,
                        approximate=True,
                    )
                else:
                    app.send_task(
                        "telemetry.ingest",
                        args=[message],
                        queue="control",
                        expires=TELEMETRY_EXPIRES_S,
                        ignore_result=True,
                        producer=producer,
                    )
                sent += 1
                if k % hb_every == i % hb_every:
                    hb = {"node": node["name"], "token": node["token"], "ts": round(now, 3), "agent_version": "bench"}
                    app.send_task(
                        "fleet.heartbeat",
                        args=[hb],
                        queue="control",
                        expires=heartbeat_s * 3,
                        ignore_result=True,
                        producer=producer,
                    )
            seq += 1
            k += 1
    print(json.dumps({"sent_telemetry": sent}), flush=True)


# --- setup and measurement (Django) -------------------------------------------------------------------------------


def setup(nodes: int, gpus_per_node: int) -> list[dict[str, Any]]:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from django.core.management import call_command

    from apps.fleet import services
    from apps.fleet.messages import GpuReport
    from workers.gpu.specs import get_spec

    call_command("migrate", verbosity=0)
    spec = get_spec("A100-80GB")
    out = []
    for i in range(nodes):
        name = f"bench-{i:03d}"
        node, token = services.node_token_issue(node_name=name)
        reports = [
            GpuReport(
                uuid=f"GPU-bench-{i:03d}-{j}",
                index=j,
                model=spec.key,
                name=spec.nvml_names[0],
                memory_mib=spec.memory_mib,
                mig_mode=False,
            )
            for j in range(gpus_per_node)
        ]
        services.node_register(node_id=node.pk, gpus=reports, agent_version="bench")
        out.append({"name": name, "token": token, "gpus": [r.uuid for r in reports]})
    return out


def clean_redis() -> Any:
    from apps.core.redis import get_redis

    r = get_redis()
    doomed = [*r.scan_iter(match="fleet:*", count=1000), b"control"]  # the stream fleet:ingest too
    for i in range(0, len(doomed), 500):
        r.delete(*doomed[i : i + 500])
    return r


def backlog(r: Any, path: str) -> int:
    """Messages waiting: the `control` queue's length, or the stream's entries not yet read by the consumer."""
    if path == "celery":
        return int(r.llen("control"))
    from apps.telemetry import keys

    try:
        groups = r.xinfo_groups(keys.INGEST_STREAM)
    except Exception:
        return int(r.xlen(keys.INGEST_STREAM))
    lag = [g.get("lag") for g in groups if g.get("name") in (keys.INGEST_GROUP, keys.INGEST_GROUP.encode())]
    return int(lag[0]) if lag and lag[0] is not None else int(r.xlen(keys.INGEST_STREAM))


def stats(r: Any) -> dict[str, int]:
    from apps.telemetry import keys

    return {k.decode(): int(v) for k, v in r.hgetall(keys.STATS).items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--heartbeat", type=float, default=5.0)
    p.add_argument("--path", choices=["stream", "celery"], default="stream")
    p.add_argument("--counters", action="store_true", help="rows carry the device counters (mem temp, energy...)")
    p.add_argument("--jobs-per-gpu", type=int, default=0, help="rows carry the memory of this many jobs per GPU")
    p.add_argument("--job-every", type=int, default=10, help="... on every Nth message of a node (agents: ~10 s)")
    p.add_argument("--owners-per-gpu", type=int, default=0, help="... and of this many owners' processes of no job")
    p.add_argument("--mig-per-gpu", type=int, default=0, help="rows carry the memory of this many MIG instances")
    p.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.generate:
        generate(a.generate, a.seconds, a.heartbeat, a.path)
        return 0
    if not os.environ.get("REDIS_URL"):
        p.error("set REDIS_URL (and DATABASE_URL for PostgreSQL), or run under scripts/with_services.py")

    t0 = time.monotonic()
    nodes = setup(a.nodes, a.gpus_per_node)
    r = clean_redis()
    gpus = a.nodes * a.gpus_per_node
    print(f"setup: {a.nodes} nodes x {a.gpus_per_node} GPUs = {gpus} GPUs in {time.monotonic() - t0:.1f} s", flush=True)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "-Q",
            "control",
            "-P",
            "solo",
            "-n",
            f"bench-ingest-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "WARNING",
        ],
        cwd=REPO,
        env=env,
    )
    ingest = None
    if a.path == "stream":
        ingest = subprocess.Popen(
            [sys.executable, "manage.py", "ingest_telemetry"], cwd=REPO, env=env, stdout=subprocess.DEVNULL
        )
    consumer = ingest or worker
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "nodes.json"
        spec.write_text(
            json.dumps(
                {
                    "nodes": nodes,
                    "counters": a.counters,
                    "jobs_per_gpu": a.jobs_per_gpu,
                    "job_every": a.job_every,
                    "owners_per_gpu": a.owners_per_gpu,
                    "mig_per_gpu": a.mig_per_gpu,
                }
            )
        )
        total = a.warmup + a.seconds + 2
        gen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.fleet_ingest",
                "--generate",
                str(spec),
                "--seconds",
                str(total),
                "--heartbeat",
                str(a.heartbeat),
                "--path",
                a.path,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(a.warmup)
            s0, c0, g0, h0, w0 = (
                stats(r),
                cpu_seconds(consumer.pid),
                cpu_seconds(gen.pid),
                cpu_seconds(worker.pid),
                time.monotonic(),
            )
            q0 = backlog(r, a.path)
            rc0 = redis_cpu(r)
            time.sleep(a.seconds)
            s1, c1, g1, h1, w1 = (
                stats(r),
                cpu_seconds(consumer.pid),
                cpu_seconds(gen.pid),
                cpu_seconds(worker.pid),
                time.monotonic(),
            )
            q1 = backlog(r, a.path)
            rc1 = redis_cpu(r)
            from apps.telemetry.selectors import all_latest_samples

            now = time.time()
            ages = sorted(now - s["ts"] for s in all_latest_samples().values())
        finally:
            gen.wait(timeout=total + 30)
            for proc in (ingest, worker):
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
    wall = w1 - w0
    samples = s1.get("samples_accepted", 0) - s0.get("samples_accepted", 0)
    messages = s1.get("messages_accepted", 0) - s0.get("messages_accepted", 0)
    stale = s1.get("messages_stale", 0) - s0.get("messages_stale", 0)
    rejected = s1.get("messages_rejected", 0) - s0.get("messages_rejected", 0)
    cpu = c1 - c0
    heartbeats = a.nodes / a.heartbeat * wall
    per_message = cpu / max(1, messages + (heartbeats if a.path == "celery" else 0))
    result = {
        "path": a.path,
        "gpus": gpus,
        "jobs_per_gpu": a.jobs_per_gpu,
        "job_every": a.job_every if a.jobs_per_gpu or a.owners_per_gpu else None,
        "owners_per_gpu": a.owners_per_gpu,
        "mig_per_gpu": a.mig_per_gpu,
        "target_samples_per_s": gpus,
        "samples_per_s": round(samples / wall, 1),
        "telemetry_messages_per_s": round(messages / wall, 1),
        "ingest_process_cpu_per_wall_s": round(cpu / wall, 3),
        "ingest_cpu_per_message_us": round(per_message * 1e6),
        # The ingest script runs inside Redis: its cost is the server's CPU (which also serves the generator and
        # the heartbeat worker, the same in every run).
        "redis_server_cpu_per_wall_s": round((rc1 - rc0) / wall, 3),
        "heartbeat_worker_cpu_per_wall_s": round((h1 - h0) / wall, 3) if a.path == "stream" else None,
        "generator_cpu_per_wall_s": round((g1 - g0) / wall, 3),
        "backlog_start_end": [q0, q1],
        "stale_dropped": stale,
        "rejected": rejected,
        "latest_age_p50_s": round(statistics.median(ages), 2) if ages else None,
        "latest_age_max_s": round(ages[-1], 2) if ages else None,
        "gpus_with_samples": len(ages),
        "window_s": round(wall, 1),
    }
    sustained = samples / wall >= 0.98 * gpus and q1 <= max(50, q0 * 2) and stale == 0
    print(json.dumps(result, indent=2))
    print(
        f"[{a.path}] {'SUSTAINED' if sustained else 'NOT sustained'}: {result['samples_per_s']:.0f} samples/s "
        f"({gpus} GPUs at 1 Hz), ingest process CPU {100 * cpu / wall:.1f}% of one core "
        f"(~{result['ingest_cpu_per_message_us']} us per message), backlog {q0} -> {q1}"
    )
    return 0 if sustained else 1


if __name__ == "__main__":
    sys.exit(main())
