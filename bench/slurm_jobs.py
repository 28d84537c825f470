"""The same job stream through the portal's own agents and through a Slurm pool, and straight into Slurm with
sbatch: what does the portal add on top of Slurm?

    python -m bench.slurm_jobs [--rate 2] [--duration 10] [--repeats 2] [--job-s 0.2]

Real processes on this machine: uvicorn, the portal's Celery worker, `manage.py scheduler`, one node agent with
4 simulated GPUs (the local-process runtime) for the agents pool; a single-host Slurm 22.05 (tests/support/slurm.py:
munged, slurmdbd on the local MariaDB, slurmctld, slurmd with 4 fake GPUs) and `python -m workers.slurm_bridge`
for the Slurm pool. Rounds are interleaved (agents, slurm, sbatch, agents, ...) so drift hits all three alike.
Each round submits `--rate` jobs a second for `--duration` seconds (each `sleep --job-s` on one GPU) and waits
for all of them to end.

Reported per path: jobs/s (jobs / first submit to last end) and submit→running p50/p99:
- agents and slurm (through the portal): the portal's "running" event minus `submitted_at`;
- sbatch: the first `squeue` poll (every 0.1 s) that shows the job RUNNING, minus the time sbatch was called.
Uses a throwaway embedded PostgreSQL and Redis (as bench.jobs_e2e) and the MariaDB server for slurmdbd.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.jobs_e2e import PY, REPO, Bench, pct, prepare_environment, seed, start_services, wait_ready

SLURM_MODEL = "A100-SLURM"


def _submit_stream(url: str, token: str, body: dict[str, Any], rate: float, duration: float) -> list[int]:
    import requests

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    ids: list[int] = []
    t0 = time.monotonic()
    for i in range(int(rate * duration)):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        resp = session.post(f"{url}/api/v1/jobs/", json=body, timeout=30)
        if resp.status_code == 201:
            ids.append(int(resp.json()["id"]))
    return ids


def portal_round(url: str, token: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    from django.db import close_old_connections

    from apps.jobs.models import TERMINAL_STATES, Job, JobEvent

    body = {"team": "bench", "image": "local/process", "command": ["sleep", str(args.job_s)], "gpu_count": 1,
            "gpu_model": model, "max_duration_s": 120, "memory_mib": 64, "cpus": 0.1}  # fmt: skip
    ids = _submit_stream(url, token, body, args.rate, args.duration)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        close_old_connections()
        if not Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL_STATES).exists():
            break
        time.sleep(0.5)
    rows = {j["id"]: j for j in Job.objects.filter(pk__in=ids).values("id", "state", "submitted_at", "ended_at")}
    seen = dict(JobEvent.objects.filter(job_id__in=ids, to_state="running").values_list("job_id", "at"))
    waits = [(seen[i] - rows[i]["submitted_at"]).total_seconds() for i in ids if i in seen]
    first = min(r["submitted_at"] for r in rows.values())
    last = max((r["ended_at"] for r in rows.values() if r["ended_at"]), default=first)
    states: dict[str, int] = {}
    for row in rows.values():
        states[row["state"]] = states.get(row["state"], 0) + 1
    span = (last - first).total_seconds()
    return {"jobs": len(ids), "states": states, "jobs_per_s": len(ids) / span if span else 0.0, "waits": waits}


def sbatch_round(slurm: Any, args: argparse.Namespace) -> dict[str, Any]:
    submitted: dict[str, float] = {}
    running: dict[str, float] = {}
    ended: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            out = slurm.run("squeue", "-h", "-t", "all", "-o", "%i %T", check=False).stdout
            now = time.monotonic()
            for line in out.splitlines():
                jid, _, state = line.partition(" ")
                if jid in submitted and state in {"RUNNING", "COMPLETING", "COMPLETED"}:
                    running.setdefault(jid, now)
                if jid in submitted and state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}:
                    ended.setdefault(jid, now)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    for i in range(int(args.rate * args.duration)):
        delay = t0 + i / args.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        at = time.monotonic()
        jid = slurm.run("sbatch", "--parsable", "-A", "bench", "--gres=gpu:a100:1", "-t", "2", "-o", "/dev/null",
                        "--mem=64M", "--wrap", f"sleep {args.job_s}").stdout.strip()  # fmt: skip
        submitted[jid] = at
    deadline = time.monotonic() + 180
    while len(ended) < len(submitted) and time.monotonic() < deadline:
        time.sleep(0.2)
    done.set()
    watcher.join()
    span = max(ended.values(), default=t0) - min(submitted.values())
    return {
        "jobs": len(submitted),
        "states": {"ended": len(ended)},
        "jobs_per_s": len(submitted) / span if span else 0.0,
        "waits": [running[j] - submitted[j] for j in submitted if j in running],
    }


def start_bridge(bench: Bench, slurm: Any, url: str, token: str) -> None:
    env = {k: v for k, v in slurm.env.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.update({"GPUPORTAL_URL": url, "GPUPORTAL_BRIDGE_TOKEN": token, "LOG_LEVEL": "WARNING"})
    argv = [PY, "-m", "workers.slurm_bridge", "--pool", "cluster", "--spool", str(bench.tmp / "spool")]
    argv += ["--poll", str(bench.args.poll), "--inventory", "30", "--models", json.dumps({"a100": SLURM_MODEL})]
    bench.spawn("bridge", argv, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of submissions per round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per path, interleaved")
    parser.add_argument("--job-s", type=float, default=0.2)
    parser.add_argument("--poll", type=float, default=0.2, help="the bridge's poll interval (s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # What bench.jobs_e2e's helpers read: one agent with 4 simulated GPUs, like the Slurm node.
    args.agents, args.gpus, args.workers, args.pool, args.interval = 1, 4, 2, "threads", 0.5
    args.database_url, args.redis_url = "", ""

    from tests.support.slurm import running_cluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"no Slurm here: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    bench = Bench(args, tmp)
    os.chdir(REPO)
    results: dict[str, list[dict[str, Any]]] = {"agents": [], "slurm": [], "sbatch": []}
    with running_cluster() as slurm:
        try:
            prepare_environment(args, tmp, bench)
            token, nodes = seed(args)
            from apps.pools.services import pool_create_token

            _, bridge_token = pool_create_token(name="cluster", backend="slurm", options={})
            slurm.add_account("bench")
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            url = f"http://127.0.0.1:{port}"
            start_services(bench, args, nodes, port)
            wait_ready(bench, port, args)
            start_bridge(bench, slurm, url, bridge_token)
            from apps.fleet.models import Gpu

            deadline = time.monotonic() + 60
            while Gpu.objects.filter(model__name=SLURM_MODEL).count() < 4 and time.monotonic() < deadline:
                time.sleep(0.5)
            for _ in range(args.repeats):
                results["agents"].append(portal_round(url, token, "A100-80GB", args))
                results["slurm"].append(portal_round(url, token, SLURM_MODEL, args))
                results["sbatch"].append(sbatch_round(slurm, args))
        finally:
            bench.stop()
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for path, rounds in results.items():
        waits = [w for r in rounds for w in r["waits"]]
        summary[path] = {
            "jobs": sum(r["jobs"] for r in rounds),
            "states": [r["states"] for r in rounds],
            "jobs_per_s": [round(r["jobs_per_s"], 2) for r in rounds],
            "submit_to_running_p50_s": round(pct(waits, 50), 3),
            "submit_to_running_p99_s": round(pct(waits, 99), 3),
        }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"{args.repeats} interleaved rounds per path, {args.rate} jobs/s for {args.duration} s, sleep {args.job_s}"
        )
        for path, s in summary.items():
            p50, p99 = s["submit_to_running_p50_s"], s["submit_to_running_p99_s"]
            print(f"  {path:<7} jobs {s['jobs']:>4}  jobs/s {s['jobs_per_s']}  submit->running p50 {p50:.3f} s")
            print(f"          p99 {p99:.3f} s  {s['states']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
