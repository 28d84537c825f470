"""What planning the starts of waiting jobs on parts costs a scheduler pass, on PostgreSQL.

    .venv/bin/python -m bench.part_plans [--shared-gpus 32] [--mig-gpus 8] [--waiting 200] [--passes 7]
        [--database-url URL]

Why: a job on a share or MIG instance that does not fit gets a planned start (apps/jobs/scheduler/parts.py), which
costs queries: for each of up to `MAX_PLANS` waiting jobs, one placement per time at which parts come free until
one fits. The pass runs every second and on every event, so this must stay small next to the pass itself.

It creates a fresh database (the name in --database-url, dropped first), migrates it, and seeds nodes of 4 GPUs:
`--shared-gpus` A100-80GB split in 4 shares and `--mig-gpus` in MIG mode with seven 1g.10gb instances. Every part
is held by a running job (estimates of 1 to 24 h), and `--waiting` jobs queue for parts (half quarters, a quarter
halves, a quarter 1g.10gb instances; estimates of 10 min to 8 h). No part frees during the measurement, so every
pass does the same work. It times whole scheduler passes (`run_pass`, fair policy), with the plans and with
`MAX_PLANS = 0` (no plans: what the pass cost before them), interleaved, and prints the median of each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import drop_database, fresh_database

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/portal_bench_parts"
DEFAULT_REDIS = "redis://127.0.0.1:6379/3"


def measure(shared_gpus: int, mig_gpus: int, waiting: int, passes: int) -> dict[str, Any]:
    """Seed, fill every part, queue the waiting jobs, and time passes with and without plans (inside Django)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from decimal import Decimal

    from django.utils import timezone

    from apps.accounts import services as accounts
    from apps.accounts.models import Role
    from apps.fleet import commands
    from apps.fleet.devices import MigInstance, gpu_set_shares, mig_layout_apply
    from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus
    from apps.jobs import scheduler, services
    from apps.jobs.models import ContainerImage, Job, JobState
    from apps.jobs.scheduler import part_plans as parts
    from apps.jobs.scheduling import FAIR
    from workers.gpu.mig import profiles_for

    # The launches would go to agents over Redis: this measures the scheduler, not the dispatch.
    commands.publish_command = lambda *args, **kwargs: None
    rng = random.Random(7)
    model = GpuModel.objects.create(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8"))
    one_g = profiles_for("A100-80GB")["1g.10gb"]
    total = shared_gpus + mig_gpus
    for n in range((total + 3) // 4):
        node = Node.objects.create(
            name=f"parts-{n:03d}", status=NodeStatus.ONLINE, token_digest="d" * 64, last_heartbeat=timezone.now()
        )
        for i in range(min(4, total - 4 * n)):
            k = 4 * n + i
            gpu = Gpu.objects.create(
                uuid=f"GPU-parts-{k:04d}", node=node, index=i, model=model, memory_mib=81920, status=GpuStatus.OK
            )
            if k < shared_gpus:
                gpu_set_shares(actor=None, gpu_uuid=gpu.uuid, shares=4)
            else:
                Gpu.objects.filter(pk=gpu.pk).update(mig_mode=True)
                instances = [
                    MigInstance(
                        uuid=f"MIG-parts-{k:04d}-{gi}", profile=one_g.name, memory_mib=one_g.memory_mib, gi_id=gi
                    )
                    for gi in range(7, 14)
                ]
                mig_layout_apply(gpu=Gpu.objects.get(pk=gpu.pk), mig_mode=True, instances=instances)
    ContainerImage.objects.create(name="bench/busybox:latest", description="busybox")
    admin = accounts.user_get_or_create(username="bench-admin", password="x" * 20, is_staff=True)
    team = accounts.team_create(actor=admin, slug="parts", name="Parts")
    user = accounts.user_get_or_create(username="parts-user", password="x" * 20)
    accounts.membership_set(actor=admin, team=team, user=user, role=Role.MEMBER)

    def submit(duration_s: int, **part: Any) -> Job:
        return services.job_submit(
            user=user, team=team, image="bench/busybox:latest", command=["true"], max_duration_s=duration_s, **part
        )

    for _ in range(shared_gpus * 4):
        submit(rng.randrange(3600, 86400), gpu_share="0.25")
    for _ in range(mig_gpus * 7):
        submit(rng.randrange(3600, 86400), mig_profile="1g.10gb")
    scheduler.run_pass(token=1, leader="bench", policy=FAIR)
    holding = Job.objects.filter(state=JobState.STARTING).count()
    kinds = [{"gpu_share": "0.25"}, {"gpu_share": "0.25"}, {"gpu_share": "0.5"}, {"mig_profile": "1g.10gb"}]
    for i in range(waiting):
        submit(rng.randrange(600, 8 * 3600), **kinds[i % len(kinds)])

    def timed(max_plans: int) -> float:
        parts.MAX_PLANS = max_plans
        # One pass first: switching between the two stores the other's pending reasons, which steady passes do not.
        scheduler.run_pass(token=1, leader="bench", policy=FAIR)
        t0 = time.perf_counter()
        result = scheduler.run_pass(token=1, leader="bench", policy=FAIR)
        assert not result.started, "a waiting job started: the measurement assumes a full fleet"
        return time.perf_counter() - t0

    planned = parts.MAX_PLANS
    with_plans: list[float] = []
    without: list[float] = []
    for _ in range(passes):
        with_plans.append(timed(planned))
        without.append(timed(0))
    parts.MAX_PLANS = planned
    scheduler.run_pass(token=1, leader="bench", policy=FAIR)  # leave the plans' reasons, not the last "without"
    told = Job.objects.filter(state=JobState.QUEUED, pending_reason="next_in_line").count()
    return {
        "parts": shared_gpus * 4 + mig_gpus * 7,
        "holding_jobs": holding,
        "waiting_jobs": waiting,
        "max_plans": planned,
        "jobs_with_a_plan": told,
        "pass_ms_with_plans": round(statistics.median(with_plans) * 1000, 1),
        "pass_ms_without_plans": round(statistics.median(without) * 1000, 1),
        "passes": passes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.part_plans", description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="main", choices=("main", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--shared-gpus", type=int, default=32)
    parser.add_argument("--mig-gpus", type=int, default=8)
    parser.add_argument("--waiting", type=int, default=200)
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args(argv)
    sizes = (args.shared_gpus, args.mig_gpus, args.waiting, args.passes)
    if min(sizes) < 0 or args.passes < 1 or args.shared_gpus + args.mig_gpus < 1:
        parser.error("sizes are non-negative, --passes at least 1, and there is at least one GPU")
    if args.mode == "measure":
        print(json.dumps(measure(*sizes)))
        return 0
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "DEBUG": "0",
        "LOG_LEVEL": "ERROR",
    }
    fresh_database(args.database_url)
    try:
        subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
        out = subprocess.run(
            [PY, "-m", "bench.part_plans", "measure", *(f"--{k}={v}" for k, v in _flags(args).items())],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        if not args.keep:
            drop_database(args.database_url)
    print(out.stdout.strip().splitlines()[-1])
    return 0


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"shared-gpus": args.shared_gpus, "mig-gpus": args.mig_gpus, "waiting": args.waiting, "passes": args.passes}


if __name__ == "__main__":
    sys.exit(main())
