"""Writes for bridged pools: the bridge's token, its nodes and GPUs, and what it reports about the jobs it runs.

Every report is idempotent: a bridge that restarts, or retries after a lost answer, sends the same report again and
the second copy changes nothing (job transitions are conditional; log lines land by their own numbering).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.tokens import generate
from apps.audit.services import audit_record
from apps.billing.models import SourceKind, UsageRecord
from apps.billing.selectors import closed_months, price_book
from apps.billing.services import ledger_insert
from apps.booking.models import Allocation, Reservation, ReservationStatus
from apps.booking.services.reservations import reservation_end
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.fleet.messages import GpuReport
from apps.fleet.models import Gpu, Node, Pool
from apps.fleet.services import node_heartbeat, node_register
from apps.jobs.models import ON_NODE_STATES, TERMINAL_STATES, Job, JobReason, JobState
from apps.jobs.services.reports import LogLineIn, job_logs_append, job_report_exit, job_report_started
from apps.jobs.services.starting import job_start
from apps.jobs.services.transitions import TransitionRefused, job_transition
from apps.pools import selectors
from apps.pools.backends import backend_of, check_options
from apps.pools.models import BridgeToken, ExternalJob


def pool_create_token(*, name: str, backend: str, options: dict[str, Any] | None = None) -> tuple[Pool, str]:
    """Create the pool if needed and issue its bridge a new token (the previous one stops working)."""
    if not backend_of(backend).bridged:
        raise ValidationFailed(f"A {backend} pool has no bridge.")
    clean = check_options(backend, dict(options or {}))
    plaintext, prefix, digest = generate("gpb")
    with transaction.atomic():
        pool, created = Pool.objects.get_or_create(name=name, defaults={"backend": backend, "options": clean})
        if not created and pool.backend != backend:
            raise Conflict(f"Pool {name} is a {pool.backend} pool.")
        if options is not None and pool.options != clean:
            pool.options = clean
            pool.save(update_fields=["options"])
        BridgeToken.objects.update_or_create(pool=pool, defaults={"prefix": prefix, "digest": digest})
    return pool, plaintext


REFUSED_REASON = "scheduler"  # Reservation.released_reason when the pool's scheduler refused it


@dataclass(frozen=True)
class NodeIn:
    name: str
    hostname: str
    gpus: Sequence[GpuReport]
    up: bool


def pool_inventory(*, pool: Pool, nodes: Sequence[NodeIn], driver: str) -> list[str]:
    """The scheduler's nodes and GPUs, as the bridge read them, into the fleet under `pool`. A node of another pool
    (or of the portal's agents) with the same name is refused, not taken over."""
    refused = []
    for item in nodes:
        with transaction.atomic():
            node, _ = Node.objects.get_or_create(name=item.name, defaults={"pool": pool})
            if node.pool_id != pool.pk:
                refused.append(item.name)
                continue
        if item.up and node.token_digest:
            # A telemetry-only agent runs on this node: it registers the GPUs (real uuids, NVML indexes, which
            # match Slurm's GRES indexes when gres.conf lists /dev/nvidiaN in order); the bridge only heartbeats.
            continue
        if item.up:
            node_register(
                node_id=node.pk, gpus=list(item.gpus), agent_version="bridge", driver_version=driver,
                hostname=item.hostname, backend=pool.backend,
            )  # fmt: skip
    return refused


def pool_heartbeat(*, pool: Pool, node_names: Sequence[str]) -> None:
    """The bridge is alive and sees these nodes up: their jobs are not lost."""
    for node_id in Node.objects.filter(pool=pool, name__in=node_names).values_list("pk", flat=True):
        node_heartbeat(node_id=node_id)


def pool_claim(*, pool: Pool) -> list[ExternalJob]:
    """Hand the bridge its unclaimed queued jobs, plus those it claimed and has not said it submitted (it may have
    submitted them before a restart: it looks them up by comment before submitting again)."""
    for job in selectors.unclaimed_jobs(pool):
        ExternalJob.objects.get_or_create(job=job, defaults={"pool": pool})
    return list(
        ExternalJob.objects.filter(pool=pool, external_id="", done=False).select_related("job__team").order_by("job")
    )


def _external(pool: Pool, job_id: int) -> ExternalJob:
    row = ExternalJob.objects.select_related("job").filter(pool=pool, job_id=job_id).first()
    if row is None:
        raise NotFound(f"Job {job_id} is not a job of pool {pool.name}.")
    return row


def pool_job_submitted(*, pool: Pool, job_id: int, external_id: str) -> ExternalJob:
    row = _external(pool, job_id)
    if row.external_id and row.external_id != external_id:
        raise Conflict(f"Job {job_id} is already {row.external_id} in {pool.name}.")
    if not row.external_id:
        row.external_id = external_id
        row.submitted_at = timezone.now()
        row.save(update_fields=["external_id", "submitted_at", "updated_at"])
    return row


def pool_job_refused(*, pool: Pool, job_id: int, message: str) -> None:
    """The scheduler refused the submission (bad account, impossible request): the job fails with its words."""
    row = _external(pool, job_id)
    try:
        job_transition(row.job, JobState.FAILED, reason=JobReason.LAUNCH_ERROR, message=message)
    except TransitionRefused:
        pass
    ExternalJob.objects.filter(pk=row.pk).update(done=True, external_state="REFUSED")


@dataclass(frozen=True)
class JobReport:
    job_id: int
    external_state: str
    phase: str  # "pending" | "running" | "ended"
    node: str = ""
    gpu_indexes: Sequence[int] = ()
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str = ""  # "succeeded" | "failed" | "cancelled"
    reason: str = ""
    exit_code: int | None = None
    message: str = ""
    log_total: int | None = None


def _start_on(job: Job, pool: Pool, report: JobReport) -> Job:
    node = Node.objects.filter(pool=pool, name=report.node).first()
    if node is None:
        raise NotFound(f"Node {report.node} is not in pool {pool.name}.")
    live = Gpu.objects.select_related("model").filter(node=node, retired_at__isnull=True).order_by("index")
    if report.gpu_indexes:
        gpus = list(live.filter(index__in=report.gpu_indexes))
    else:
        # It ended before the bridge saw which GPUs it had (Slurm's accounting keeps counts, not indexes): the
        # ledger needs the count and the model; the first GPUs no running job holds stand in for them.
        held = Job.gpus.through.objects.filter(job__state__in=ON_NODE_STATES).values_list("gpu_id", flat=True)
        gpus = list(live.exclude(pk__in=held)[: job.gpu_count]) or list(live[: job.gpu_count])
    if not gpus or (report.gpu_indexes and len(gpus) != len(set(report.gpu_indexes))):
        raise ValidationFailed(f"Node {node.name} has no GPUs {list(report.gpu_indexes)} in the portal.")
    with transaction.atomic():
        job = job_start(job=job, node=node, gpus=gpus, now=report.started_at or timezone.now())
    return job


def pool_job_report(*, pool: Pool, report: JobReport) -> dict[str, Any]:
    """Apply what the scheduler says about one job; returns the portal's view, which the bridge acts on
    (`stop`: the portal ended it or asked it stopped, so the bridge cancels it there)."""
    row = _external(pool, report.job_id)
    job = row.job
    if report.phase in {"running", "ended"} and job.state == JobState.QUEUED and report.node:
        try:
            job = _start_on(job, pool, report)
        except TransitionRefused:
            job.refresh_from_db()
    if report.phase in {"running", "ended"} and job.state == JobState.STARTING and job.node_id is not None:
        job_report_started(node_id=job.node_id, job_id=job.pk, handle=row.external_id, at=report.started_at)
        job.refresh_from_db()
    done = False
    if report.phase == "pending" and job.state == JobState.QUEUED:
        # The pool's scheduler's own words for the wait (Slurm's Reason: Priority, Resources, ...).
        Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
            pending_reason=report.external_state.lower()[:40], pending_message=f"{pool.name}: {report.message}"[:300]
        )
    if report.phase == "ended":
        done = True
        if job.node_id is not None and job.state not in TERMINAL_STATES:
            job_report_exit(
                node_id=job.node_id, job_id=job.pk, state=report.outcome, reason=report.reason,
                exit_code=report.exit_code, message=report.message, finished_at=report.ended_at,
                log_total=report.log_total, started_at=report.started_at, handle=row.external_id,
            )  # fmt: skip
        elif job.state == JobState.QUEUED:
            # Ended without running (cancelled or refused while pending there).
            final = JobState.CANCELLED if report.outcome == "cancelled" else JobState.FAILED
            reason = JobReason.CANCELLED if final == JobState.CANCELLED else JobReason.LAUNCH_ERROR
            try:
                job_transition(job, final, reason=reason, message=report.message)
            except TransitionRefused:
                pass
        elif report.log_total is not None:
            Job.objects.filter(pk=job.pk).update(log_expected=report.log_total)
        job.refresh_from_db()
    ExternalJob.objects.filter(pk=row.pk).update(external_state=report.external_state[:32], done=done)
    return {"job_id": job.pk, "state": job.state, "stop": _should_stop(job)}


def _should_stop(job: Job) -> bool:
    return job.state in TERMINAL_STATES or job.stop_requested_at is not None


def pool_job_logs(*, pool: Pool, job_id: int, epoch: str, first: int, lines: Sequence[LogLineIn]) -> int:
    row = _external(pool, job_id)
    if row.job.node_id is None:
        return 0
    return job_logs_append(node_id=row.job.node_id, job_id=job_id, epoch=epoch, first=first, lines=lines)


def follow_view(row: ExternalJob) -> dict[str, Any]:
    job = row.job
    return {
        "job_id": job.pk,
        "external_id": row.external_id,
        "state": job.state,
        "stop": _should_stop(job),
        "log_epoch": job.log_epoch,
        "log_agent_seq": job.log_agent_seq,
    }


def pool_reservation_refused(*, pool: Pool, reservation_id: int, message: str) -> bool:
    """The pool's scheduler refused to hold a reservation's GPUs: the portal gives it up too (cancelled before its
    start, released after), with the scheduler's words in the audit log. False when it had already ended."""
    reservation = Reservation.objects.select_related("user").filter(pk=reservation_id).first()
    if reservation is None or not Allocation.objects.filter(reservation=reservation, gpu__node__pool=pool).exists():
        raise NotFound(f"Reservation {reservation_id} holds no GPUs of pool {pool.name}.")
    if reservation.status not in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE) or reservation.user is None:
        return False
    with transaction.atomic():
        reservation_end(user=reservation.user, reservation_id=reservation.pk)
        Reservation.objects.filter(pk=reservation.pk).update(released_reason=REFUSED_REASON)
        audit_record(actor=None, action="reservation.refused", target=reservation,
                     data={"pool": pool.name, "message": message[:2000]})  # fmt: skip
    return True


# UsageRecord.source of a job that ran in a pool's scheduler without the portal (submitted there directly); its
# source_id is the scheduler's job id. Jobs the portal submitted are billed from their own allocations.
EXTERNAL_SOURCE = SourceKind.SLURM


@dataclass(frozen=True)
class UsageIn:
    external_id: int
    account: str
    node: str
    gpus: int
    start: datetime
    end: datetime


def pool_usage(*, pool: Pool, records: Sequence[UsageIn]) -> dict[str, Any]:
    """Ledger rows for the GPU time of jobs that ran in the pool's scheduler outside the portal, under the account
    of a team: one row per GPU and local day at the GPU model's price, inserted with the ledger's own idempotency
    (a record sent twice is billed once). Accounting keeps GPU counts, not indexes: the node's first GPUs stand
    for them. Jobs the portal submitted are skipped (billed from their allocations), as are closed months."""
    portal_ids = set(
        ExternalJob.objects.filter(pool=pool, external_id__in=[str(r.external_id) for r in records]).values_list(
            "external_id", flat=True
        )
    )
    teams = {t.slug: t for t in Team.objects.filter(slug__in={r.account for r in records})}
    gpus_by_node: dict[str, list[Gpu]] = {}
    for gpu in Gpu.objects.filter(node__pool=pool, retired_at__isnull=True).select_related("node").order_by("index"):
        gpus_by_node.setdefault(gpu.node.name, []).append(gpu)
    book = price_book(gpu_model_ids={g.model_id for gs in gpus_by_node.values() for g in gs})
    closed = closed_months()
    rows: list[UsageRecord] = []
    unknown: set[str] = set()
    for record in records:
        team = teams.get(record.account)
        if str(record.external_id) in portal_ids or record.end <= record.start or record.gpus < 1:
            continue
        if team is None:
            unknown.add(record.account)
            continue
        for gpu in gpus_by_node.get(record.node.split(",")[0], [])[: record.gpus]:
            for piece in book.split(gpu.model_id, record.start, record.end):
                if piece.month in closed:
                    continue
                rows.append(
                    UsageRecord(
                        team=team, user=None, gpu=gpu, gpu_model_id=gpu.model_id, source=EXTERNAL_SOURCE,
                        source_id=record.external_id, allocation=None, start=piece.start, end=piece.end,
                        day=piece.day, month=piece.month, gpu_seconds=piece.seconds, share=Decimal(1),
                        hourly_price=piece.hourly_price, cost=piece.cost, mean_utilization=None,
                    )
                )  # fmt: skip
    with transaction.atomic():
        ledger_insert(rows)
    return {"rows": len(rows), "unknown_accounts": sorted(unknown)}


def bridge_touch(pool: Pool) -> None:
    BridgeToken.objects.filter(pool=pool).update(last_used_at=timezone.now())
