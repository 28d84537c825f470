"""Starting jobs (the scheduler's writes): queued → starting on chosen GPUs, one job or a batch, and launches.

A start books the job's GPUs in booking's occupancy table (its exclusion constraint is the last guard against two
jobs on one GPU) and sends the launch command to the node's agent after commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.billing.selectors.unbilled import hourly_cost, mig_profile_prices
from apps.fleet.models import DeviceKind, Gpu, Node
from apps.jobs import conf, events, occupancy
from apps.jobs.models import Job, JobEvent, JobState
from apps.jobs.services.transitions import TransitionRefused, job_transition


def launch_request(job: Job, gpus: Sequence[Gpu]) -> dict[str, Any]:
    """What the node agent gets: exactly the fields workers/runtimes/policy.py understands. A MIG instance goes by
    its own uuid; shares of a GPU by the GPU's uuid (a share is no device to the driver) with the share and the
    memory it may use, for the runtime to set MPS limits or tell a time-sliced job its budget."""
    uuids: list[str] = []
    share = Decimal(0)
    memory = 0
    held: dict[str, int] = {}  # shares held per split GPU
    split: dict[str, int] = {}
    for g in gpus:
        if g.kind == DeviceKind.SHARE and g.parent is not None:
            if g.parent.uuid not in uuids:
                uuids.append(g.parent.uuid)
            held[g.parent.uuid] = held.get(g.parent.uuid, 0) + 1
            split[g.parent.uuid] = g.parent.shares
            share += g.capacity
            memory += g.memory_mib
        else:
            uuids.append(g.uuid)
    # Every share of a split GPU is the whole GPU (the shares' capacities are rounded: 3 x 0.3333), launched as
    # one: no share, no memory budget (the agent lifts an MPS limit it set on the GPU for shares before).
    whole = bool(held) and all(n >= split[u] for u, n in held.items())
    extra: dict[str, Any] = {}
    if 0 < share < 1 and not whole:
        extra = {"gpu_share": float(share), "gpu_memory_mib": memory}
    return {
        **extra,
        "job_id": job.pk,
        "image": job.image,
        "command": list(job.command),
        "env": dict(job.env),
        "gpu_uuids": uuids,
        "cpus": float(job.cpus),
        "memory_mib": job.memory_mib,
        "max_duration_s": job.max_duration_s,
        "mounts": list(job.mounts),
        "network": "none",
    }


def job_devices(job: Job) -> list[Gpu]:
    """The devices a job holds, parts of GPUs included (`job.gpus` lists physical GPUs only: Gpu.objects)."""
    return list(Gpu.devices.filter(jobs=job).select_related("parent", "model"))


def job_start(*, job: Job, node: Node, gpus: Sequence[Gpu], now: datetime, savepoint: bool = True) -> Job:
    """queued → starting on `gpus` of `node`: allocations (outside a reservation), then the launch command.

    Raises Conflict when a GPU is already held (the allocation constraint) and TransitionRefused when the job is no
    longer queued; nothing of it stays. The launch is sent after commit. Nested, it runs in one savepoint;
    `savepoint=False` for a caller that has its own around the call (the scheduler: one start of a pass that
    may fail while the others go on), which saves the three nested savepoints' six round trips.
    """
    from apps.fleet.commands import agent_send

    with transaction.atomic(savepoint=savepoint):
        price = hourly_price_of(gpus)
        job = job_transition(
            job,
            JobState.STARTING,
            update={
                "node": node,
                "scheduled_at": now,
                "launch_sent_at": now,
                "launch_attempts": 1,
                "hourly_price": price,
                "pending_reason": "",
                "pending_message": "",
            },
            savepoint=False,  # inside this function's own transaction or savepoint, or the caller's
        )
        Job.gpus.through.objects.bulk_create([Job.gpus.through(job_id=job.pk, gpu_id=g.pk) for g in gpus])
        if job.reservation_id is None:
            end = now + timedelta(seconds=job.max_duration_s + conf.ALLOCATION_SLACK_S)
            occupancy.allocate(job=job, gpus=gpus, start=now, end=end, savepoint=False)
        agent_send(node=node, task="agent.launch_job", body=launch_request(job, gpus))
    return job


@dataclass(frozen=True)
class StartItem:
    """One start the scheduler decided: the job, its node and the GPUs there."""

    job: Job
    node: Node
    gpus: Sequence[Gpu]


def jobs_start_many(*, items: Sequence[StartItem], now: datetime, savepoint: bool = True) -> list[int]:
    """queued → starting for many jobs in a handful of statements: what `job_start` does for each, batched.

    For the scheduler's common case (no reservation, no concurrent-GPU quota: the caller checks), where a pass
    starts tens of jobs and one savepoint, UPDATE, event and allocation insert per job was most of its time.
    All or nothing: raises Conflict when a GPU is held meanwhile or a job is no longer queued, and the caller (in
    a savepoint) starts them one by one to learn which. Returns the started ids; launches are sent after commit.
    `savepoint` as for `job_start`. Locks: the jobs' rows (FOR UPDATE), then booking's GPU allocations.
    """
    from apps.booking import services as booking
    from apps.booking.models import AllocationKind
    from apps.fleet.commands import agent_send

    if not items:
        return []
    ids = [item.job.pk for item in items]
    with transaction.atomic(savepoint=savepoint):
        # The row locks make the state check and the UPDATEs below one step, as job_transition's conditional
        # UPDATE does for one job (a cancel racing a start waits here, then finds the job starting).
        queued = set(
            Job.objects.select_for_update()
            .filter(pk__in=ids, state=JobState.QUEUED)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if len(queued) != len(ids):
            raise TransitionRefused("A job of this pass is no longer queued.")
        by_target: dict[tuple[int, Decimal], list[int]] = {}
        prices: dict[int, Decimal] = {}
        profile_prices = _profile_prices([g for item in items for g in item.gpus])
        for item in items:
            price = hourly_price_of(item.gpus, profile_prices)
            prices[item.job.pk] = price
            by_target.setdefault((item.node.pk, price), []).append(item.job.pk)
        common: dict[str, Any] = {
            "state": JobState.STARTING,
            "updated_at": now,
            "scheduled_at": now,
            "launch_sent_at": now,
            "launch_attempts": 1,
            "pending_reason": "",
            "pending_message": "",
        }
        for (node_id, price), job_ids in by_target.items():
            Job.objects.filter(pk__in=job_ids).update(node_id=node_id, hourly_price=price, **common)
        JobEvent.objects.bulk_create(
            [JobEvent(job_id=pk, at=now, from_state=JobState.QUEUED, to_state=JobState.STARTING) for pk in ids]
        )
        Job.gpus.through.objects.bulk_create(
            [Job.gpus.through(job_id=item.job.pk, gpu_id=g.pk) for item in items for g in item.gpus]
        )
        booking.allocations_create_many(
            [
                booking.AllocationRequest(
                    gpu_ids=[g.pk for g in item.gpus],
                    team=item.job.team,
                    user=item.job.user,
                    start=now,
                    end=now + timedelta(seconds=item.job.max_duration_s + conf.ALLOCATION_SLACK_S),
                    kind=AllocationKind.JOB,
                    job_id=item.job.pk,
                )
                for item in items
            ],
            savepoint=False,  # inside this function's own transaction or savepoint, or the caller's
        )
        occupancy.announce_started([item.job for item in items], start=now)
        for item in items:
            job = item.job
            for name, value in common.items():
                setattr(job, name, value)
            job.node = item.node
            job.hourly_price = prices[job.pk]
            events.broadcast_state_on_commit(job)
            agent_send(node=item.node, task="agent.launch_job", body=launch_request(job, item.gpus))
    return ids


def note_outside_use(*, job_id: int, where: str, what: str = "GPU") -> None:
    """A job started on a GPU or part something outside the portal uses (`where`: which, with the memory used),
    because nothing free of such use fitted, says so on its start event: the job page's timeline explains a job
    slower than usual or out of GPU memory."""
    event = JobEvent.objects.filter(job_id=job_id, to_state=JobState.STARTING).order_by("-id").first()
    if event is not None:
        event.message = f"memory in use outside the portal on {where}: no {what} free of such use fitted"
        event.save(update_fields=["message"])


def job_resend_launch(*, job: Job) -> None:
    """Send the launch again (the first message may have died with Redis); the agent ignores a duplicate."""
    from apps.fleet.commands import agent_send

    if job.node is None:
        return
    with transaction.atomic():
        updated = Job.objects.filter(pk=job.pk, state=JobState.STARTING).update(
            launch_sent_at=timezone.now(), launch_attempts=job.launch_attempts + 1
        )
        if updated:
            agent_send(node=job.node, task="agent.launch_job", body=launch_request(job, job_devices(job)))


def hourly_price_of(gpus: Sequence[Gpu], profile_prices: dict[tuple[int, str], Decimal] | None = None) -> Decimal:
    """What a job on these devices costs an hour, as the ledger will bill it (billing's `hourly_cost`): a part at
    its share of its GPU's price, a MIG instance at the admin's price of its profile where there is one. Shown as
    the job's cost so far."""
    if profile_prices is None:
        profile_prices = _profile_prices(gpus)
    return sum(
        (
            hourly_cost(
                gpu_model_id=g.model_id,
                profile=g.mig_profile,
                share=g.capacity,
                gpu_hourly_price=g.model.hourly_price,
                profile_prices=profile_prices,
            )
            for g in gpus
        ),
        Decimal("0"),
    )


def _profile_prices(gpus: Sequence[Gpu]) -> dict[tuple[int, str], Decimal]:
    return mig_profile_prices() if any(g.mig_profile for g in gpus) else {}
