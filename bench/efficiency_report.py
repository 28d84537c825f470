"""How fast is the efficiency report on a big month? Prints seconds for its memory query and for the whole report.

Why: the report's memory figures (`apps/efficiency/report._memory_shares`) run two correlated subqueries per job-GPU
link, one over the minute rollups inside the job's run and one over the hourly rollups for the hours whose minutes
are pruned; admins open the report for the whole fleet, and a past month is mostly hours.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal_efficiency_bench \\
        .venv/bin/python -m bench.efficiency_report [--jobs 20000] [--gpus 200] [--runs 5]

PostgreSQL only, on a scratch database: its name must end in `_bench` (created if missing); the bench migrates it and
replaces the rows of its synthetic fleet ("effbench-*" nodes, teams and users). The month is the previous one, laid
out as production keeps it: hourly rollups for every hour of the month, minute rollups only from
`minutes_kept_from()` on (the prune has deleted the older ones), so both subqueries do work. `--jobs` jobs spread
over the month on `--gpus` GPUs, 10-110 minutes each, one in ten on 8 GPUs, each with a ledger row per GPU. Timed
(median of `--runs`): the memory query alone (`memory_query_s`) and the whole report for an admin (`report_s`).
`--log-lines N` gives every job N lines of log (the report's "Most idle" rows must not read them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from bench.billing_report import _ensure_database, _median


def _generate(jobs: int, gpus: int, log_lines: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from apps.accounts.models import Membership, Role, Team
    from apps.billing import costing, selectors
    from apps.billing.models import UsageRecord
    from apps.fleet.models import Gpu, GpuModel, Node
    from apps.jobs.models import Job, JobState
    from apps.telemetry.selectors import minutes_kept_from

    month = costing.previous_month(selectors.current_month())
    first, after = costing.month_bounds(month, selectors.local_tz())
    Job.objects.filter(team__slug__startswith="effbench-").delete()
    UsageRecord.objects.filter(team__slug__startswith="effbench-").delete()
    Gpu.objects.filter(node__name__startswith="effbench-").delete()
    model, _ = GpuModel.objects.get_or_create(
        name="A100-80GB", defaults={"memory_mib": 81920, "hourly_price": Decimal("2.2")}
    )
    gpu_rows = []
    for n in range((gpus + 7) // 8):
        node, _ = Node.objects.get_or_create(name=f"effbench-{n:04d}")
        gpu_rows += [Gpu(uuid=f"GPU-effbench-{n:04d}-{i}", node=node, index=i, model=model, memory_mib=81920)
                     for i in range(8)]  # fmt: skip
    Gpu.objects.bulk_create(gpu_rows[:gpus])
    gpu_ids = list(Gpu.objects.filter(node__name__startswith="effbench-").order_by("pk").values_list("pk", flat=True))
    teams = [Team.objects.get_or_create(slug=f"effbench-{t:02d}", defaults={"name": f"Eff {t}"})[0] for t in range(20)]
    users = []
    for t, team in enumerate(teams):
        for u in range(10):
            user, created = get_user_model().objects.get_or_create(username=f"effbench-{t:02d}-{u}")
            if created:
                Membership.objects.create(user=user, team=team, role=Role.MANAGER if u == 0 else Role.MEMBER)
            users.append((team, user))
    span = (after - first).total_seconds() - 7200
    t0 = time.perf_counter()
    made, links, ledger = [], [], []
    for k in range(jobs):
        team, user = users[(k * 7) % len(users)]
        start = first + timedelta(seconds=(k * 7919.0) % span)
        minutes = 10 + (k * 13) % 100
        made.append(
            Job(team=team, user=user, image="x", command=["true"], gpu_count=8 if k % 10 == 0 else 1, cpus=Decimal(1),
                memory_mib=1024, max_duration_s=7200, state=JobState.SUCCEEDED, started_at=start,
                ended_at=start + timedelta(minutes=minutes))
        )  # fmt: skip
    Job.objects.bulk_create(made, batch_size=5000)
    link = Job.gpus.through
    for k, job in enumerate(made):
        base = (k * 8) % len(gpu_ids)
        for i in range(job.gpu_count):
            gpu = gpu_ids[(base + i) % len(gpu_ids)]
            links.append(link(job_id=job.pk, gpu_id=gpu))
            assert job.started_at is not None and job.ended_at is not None
            seconds = int((job.ended_at - job.started_at).total_seconds())
            cost = Decimal(seconds) * Decimal("2.2") / 3600
            ledger.append(
                UsageRecord(team=job.team, user=job.user, gpu_id=gpu, gpu_model=model, source="job", source_id=job.pk,
                            start=job.started_at, end=job.ended_at, day=job.started_at.date(), month=month,
                            gpu_seconds=seconds, hourly_price=Decimal("2.2"), cost=cost,
                            mean_utilization=Decimal("0.5"))
            )  # fmt: skip
    link.objects.bulk_create(links, batch_size=10000)
    UsageRecord.objects.bulk_create(ledger, batch_size=10000)
    jobs_s = time.perf_counter() - t0
    split = minutes_kept_from()
    t0 = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO telemetry_gpuhourlyrollup (gpu_id, hour, samples, util_mean, mem_used_max)
            SELECT g, h, 3600, ((extract(epoch FROM h)::bigint / 3600 + g) %% 100)::float,
                   (extract(epoch FROM h)::bigint / 3600 * 7 + g * 13) %% 81920
            FROM unnest(%s::bigint[]) g, generate_series(%s::timestamptz, %s::timestamptz, interval '1 hour') h
            """,
            [gpu_ids, first, after - timedelta(hours=1)],
        )
        if split < after:
            cur.execute(
                """
                INSERT INTO telemetry_gpurollup (gpu_id, minute, samples, util_mean, mem_used_max)
                SELECT g, m, 60, ((extract(epoch FROM m)::bigint / 60 + g) %% 100)::float,
                       (extract(epoch FROM m)::bigint / 60 * 7 + g * 13) %% 81920
                FROM unnest(%s::bigint[]) g, generate_series(%s::timestamptz, %s::timestamptz, interval '1 minute') m
                """,
                [gpu_ids, split, after - timedelta(minutes=1)],
            )
        if log_lines:
            cur.execute(
                """
                INSERT INTO jobs_joblogline (job_id, seq, stream, at, line)
                SELECT j.id, s, 'stdout', j.started_at, 'step ' || s || '/1000 loss=2.41 lr=3e-4 tokens/s=51234'
                FROM jobs_job j, generate_series(1, %s) s WHERE j.team_id = ANY(%s)
                """,
                [log_lines, [t.pk for t in teams]],
            )
        for table in ("telemetry_gpurollup", "telemetry_gpuhourlyrollup", "jobs_job", "billing_usagerecord"):
            cur.execute(f"ANALYZE {table}")
    return {
        "month": f"{month:%Y-%m}",
        "jobs": jobs,
        "job_gpu_links": len(links),
        "gpus": len(gpu_ids),
        "minutes_kept_from": split.isoformat(),
        "log_lines_per_job": log_lines,
        "generate_jobs_s": round(jobs_s, 1),
        "generate_rollups_s": round(time.perf_counter() - t0, 1),
        "team_ids": [t.pk for t in teams],
        "month_date": month,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--gpus", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log-lines", type=int, default=0, help="log lines per job (the worst jobs' rows read them)")
    parser.add_argument("--json", action="store_true", help="print one JSON document only")
    args = parser.parse_args(argv)
    _ensure_database()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from apps.accounts import services as account_services
    from apps.efficiency.report import _memory_shares, efficiency_report
    from apps.telemetry.models import GpuHourlyRollup, GpuRollup

    call_command("migrate", verbosity=0)
    info = _generate(args.jobs, args.gpus, args.log_lines)
    month, team_ids = info.pop("month_date"), info.pop("team_ids")
    admin = account_services.user_get_or_create(username="effbench-admin", password="bench-pw", is_staff=True)
    results: dict[str, Any] = {
        **info,
        "minute_rows": GpuRollup.objects.count(),
        "hourly_rows": GpuHourlyRollup.objects.count(),
        "postgres": connection.cursor().connection.info.server_version,
    }
    results["memory_query_s"], shares = _median(lambda: _memory_shares(month, team_ids), args.runs)
    results["jobs_measured"] = sum(len(v) for v in shares.values())
    results["report_s"], report = _median(lambda: efficiency_report(user=admin, month=month), args.runs)
    results["report_teams"] = len(report["teams"])
    for key, value in list(results.items()):
        if key.endswith("_s") and isinstance(value, float):
            results[key] = round(value, 3)
    if args.json:
        print(json.dumps(results))
    else:
        width = max(len(k) for k in results)
        for key, value in results.items():
            print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
