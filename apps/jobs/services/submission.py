"""Job submission: validate, authorize and queue a job, and count its max duration against the team's quota."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import team_ids_of
from apps.accounts.types import User
from apps.booking import quota as quota_math
from apps.booking import selectors as booking_selectors
from apps.booking.selectors import local_tz
from apps.booking.services.devices import (
    check_part_in_fleet,
    check_profile,
    parse_memory,
    parse_share,
    profiles_with_memory,
)
from apps.core.errors import ApplicationError, Forbidden, NotFound, ValidationFailed
from apps.core.ttlcache import TTLCache
from apps.fleet.models import Gpu, GpuModel
from apps.jobs import conf, events, occupancy, selectors, validation
from apps.jobs.models import ContainerImage, Job, JobEvent, JobState, TeamJobPolicy
from apps.pools import selectors as pools_selectors

if TYPE_CHECKING:
    from apps.booking.models import Reservation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeamLimits:
    """What a team's members may ask for: its job policy, or the installation's defaults."""

    max_priority: int
    max_duration_s: int
    max_gpus_per_job: int | None
    max_queued_jobs: int


def limits_of(policy: TeamJobPolicy | None) -> TeamLimits:
    """The limits of a team with this policy (None: no policy); a policy never exceeds conf.MAX_DURATION_S."""
    return TeamLimits(
        max_priority=policy.max_priority if policy else conf.DEFAULT_MAX_PRIORITY,
        max_duration_s=min(policy.max_duration_s or conf.MAX_DURATION_S, conf.MAX_DURATION_S)
        if policy
        else conf.MAX_DURATION_S,
        max_gpus_per_job=policy.max_gpus_per_job if policy else None,
        max_queued_jobs=(
            policy.max_queued_jobs if policy and policy.max_queued_jobs else conf.DEFAULT_MAX_QUEUED_PER_TEAM
        ),
    )


def _field_error(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={field: [message]})


def _check_int(field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field_error(field, f"{field} must be an integer.")
    if not lo <= value <= hi:
        raise _field_error(field, f"{field} must be between {lo} and {hi}.")
    return value


def _check_cpus(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal) or not math.isfinite(float(value)):
        raise _field_error("cpus", "cpus must be a number.")
    if not 0 < float(value) <= conf.MAX_CPUS:
        raise _field_error("cpus", f"cpus must be more than 0 and at most {conf.MAX_CPUS}.")
    return Decimal(str(value)).quantize(Decimal("0.01"))


def _check_image(name: Any, image: ContainerImage | None) -> ContainerImage:
    """`image`: the enabled allow-list entry named `name`, as the caller looked it up (None: there is none)."""
    if not isinstance(name, str) or not name:
        raise _field_error("image", "image is required.")
    if image is None:
        allowed = list(ContainerImage.objects.filter(enabled=True).values_list("name", flat=True)[:20])
        raise ValidationFailed(
            f"Image {name!r} is not on the portal's allow-list.",
            code="image_not_allowed",
            fields={"image": [f"not allowed; allowed images: {', '.join(allowed) or 'none'}"]},
        )
    return image


# The size of the largest node with GPUs of these models (a sorted tuple; () for any model).
_largest_node = TTLCache[tuple[str, ...], int](ttl_s=10.0)


def _check_fleet_shape(gpu_count: int, models: list[str]) -> None:
    """Refuse what can never run: an unknown model, or more whole GPUs of the models than any one node has.

    The largest node's size is remembered for a few seconds and only used to accept (the query counts every GPU of
    the fleet, on every submission): a refusal is always decided on fresh numbers. A node retired in those
    seconds can let a job in that waits with the scheduler's "no node has N GPUs" reason instead of a 400."""
    key = tuple(sorted(models))
    hit = _largest_node.get(key)
    if hit is not None and 0 < gpu_count <= hit:
        return
    if models:
        known = set(GpuModel.objects.filter(name__in=models).values_list("name", flat=True))
        unknown = [m for m in models if m not in known]
        if unknown:
            raise _field_error("gpu_model", f"Unknown GPU model {unknown[0]!r}.")
    # A GPU in MIG mode runs jobs on its instances only, never whole (a GPU split in shares is taken whole).
    gpus = Gpu.objects.filter(retired_at__isnull=True, mig_mode=False)
    if models:
        gpus = gpus.filter(model__name__in=models)
    largest = gpus.values("node_id").annotate(n=Count("id")).order_by("-n").values_list("n", flat=True).first() or 0
    _largest_node.set(key, largest)
    what = f"GPUs of model {'|'.join(models)}" if models else "GPUs"
    if largest == 0:
        raise _field_error(
            "gpu_model" if models else "gpu_count",
            f"No {what} outside MIG mode in the fleet (a GPU in MIG mode runs jobs on its instances: mig_profile).",
        )
    if gpu_count > largest:
        raise _field_error(
            "gpu_count", f"No node has {gpu_count} {what} (the largest has {largest}); a job runs on one node."
        )


# A queue this close to the team's limit is counted again inside the submission's transaction.
_QUEUED_RECOUNT_MARGIN = 16


def _refuse_if_queue_full(team: Team, queued: int, limit: int) -> None:
    if queued >= limit:
        raise ApplicationError(
            f"Team {team.slug} already has {queued} queued jobs (at most {limit}).", code="too_many_queued", status=429
        )


def _check_reservation(
    reservation_id: Any, *, user: User, team: Team, gpu_count: int, max_duration_s: int
) -> Reservation:
    from apps.booking.models import Reservation, ReservationStatus

    if isinstance(reservation_id, bool) or not isinstance(reservation_id, int):
        raise _field_error("reservation", "reservation must be a reservation id.")
    reservation = Reservation.objects.visible_to(user).filter(pk=reservation_id).first()
    if reservation is None:
        raise NotFound("No such reservation.", fields={"reservation": ["no such reservation"]})
    if reservation.team_id != team.pk:
        raise Forbidden(
            "That reservation belongs to another team.", fields={"reservation": ["belongs to another team"]}
        )
    now = timezone.now()
    if reservation.status not in (ReservationStatus.BOOKED, ReservationStatus.ACTIVE) or reservation.end <= now:
        raise _field_error("reservation", "That reservation has ended or was cancelled.")
    if gpu_count > reservation.gpu_count:
        raise _field_error("gpu_count", f"The reservation holds {reservation.gpu_count} GPU(s).")
    window = (reservation.end - max(reservation.start, now)).total_seconds()
    if max_duration_s > window:
        raise _field_error(
            "max_duration_s", f"max_duration_s must fit the reservation (at most {int(window)} s from its start)."
        )
    return reservation


def _check_part(
    mig_profile: Any, gpu_share: Any, gpu_count: int, mig_memory_mib: Any = None, *, check_fleet: bool = True
) -> Decimal | None:
    """A job on a part of a GPU: a known MIG profile, any instance with at least `mig_memory_mib` (one the fleet
    has), or a share in (0, 1]; one GPU. Returns the share (None for whole GPUs or a MIG instance); 400 otherwise."""
    if not mig_profile and gpu_share is None and mig_memory_mib is None:
        return None
    if mig_profile is not None and not isinstance(mig_profile, str):
        raise _field_error("mig_profile", "mig_profile is a profile name, e.g. 1g.10gb.")
    if sum((bool(mig_profile), gpu_share is not None, mig_memory_mib is not None)) > 1:
        raise _field_error("gpu_share", "Give one of mig_profile, mig_memory_mib and gpu_share.")
    if gpu_count != 1:
        raise _field_error("gpu_count", "A MIG instance or a share is one GPU's part: gpu_count 1.")
    if mig_memory_mib is not None:
        parse_memory(mig_memory_mib)
        if check_fleet:
            profiles_with_memory(mig_memory_mib)
        return None
    if mig_profile:
        check_profile(mig_profile)
        return None
    return parse_share(gpu_share)


def _reserved_part(
    reservation: Reservation, mig_profile: str, share: Decimal | None, gpu_count: int
) -> tuple[str, Decimal | None]:
    """The part a job in `reservation` runs on, as (mig_profile, share): the one it names, which the reservation
    must hold (a share: as many of its shares of one GPU as make it), or, naming none, the reservation's own when it
    holds parts of GPUs (all its shares of one GPU); 400 when they do not match."""
    parts = booking_selectors.reservation_parts(reservation_id=reservation.pk)
    if not parts:
        if mig_profile or share is not None:
            raise _field_error("reservation", "That reservation holds whole GPUs: a job in it runs on them.")
        return "", None
    if gpu_count != 1:
        raise _field_error("gpu_count", "That reservation holds parts of GPUs: a job in it runs on one, gpu_count 1.")
    per_gpu = booking_selectors.reserved_share_per_gpu(parts)
    if mig_profile or share is not None:
        fits = any(p.matches(mig_profile, share) for p in parts)
        if fits and share is not None:
            fits = any(total >= share - Decimal("0.0001") for total in per_gpu.values())
        if not fits:
            held = ", ".join(sorted({p.label for p in parts}))
            most = max(per_gpu.values(), default=None)
            of_one = f" ({most.normalize():f} of one GPU)" if most is not None else ""
            raise _field_error("reservation", f"That reservation holds {held}{of_one}, not what this job asks for.")
        return mig_profile, share
    kinds = {(p.mig_profile, p.share) for p in parts}
    if len(kinds) != 1:
        raise _field_error("mig_profile", "That reservation holds different parts: name the one to run on.")
    profile, part_share = kinds.pop()
    if part_share is not None:
        part_share = max(per_gpu.values())  # all it holds of one GPU: a job in a half-GPU reservation gets the half
    return profile, part_share


def job_submit(
    *,
    user: User,
    team: Team,
    image: str,
    command: Any,
    gpu_count: int = 1,
    gpu_model: Any = None,
    gpu_models: Any = None,
    env: Any = None,
    mounts: Any = None,
    name: str = "",
    cpus: Any = None,
    memory_mib: Any = None,
    max_duration_s: Any = None,
    priority: Any = 0,
    reservation_id: Any = None,
    network: str | None = None,
    options: Mapping[str, Any] | None = None,
    idempotency_key: str = "",
    check_fleet: bool = True,
    mig_profile: str | None = None,
    gpu_share: Any = None,
    pool: Any = None,
    mig_memory_mib: Any = None,
) -> Job:
    """Validate, authorize and queue a job; counts its max duration against the team's quota.

    Refusals are ApplicationErrors (400 invalid, 403 forbidden/policy_violation/quota_exceeded, 404) and leave
    nothing behind. With `idempotency_key`, a second submission with the same key returns the first job.
    `check_fleet=False` skips "could this ever fit the fleet" (demo data loaded before any agent registered).
    Locks: the team's quota usage row (booking's quota service), for the whole transaction.
    """
    # `is_member`: when the caller looked the team up with booking's team_for_booking (saves a query).
    member = getattr(team, "is_member", None)
    if member is None:
        member = team.pk in team_ids_of(user)
    if not user.is_staff and not member:
        raise Forbidden(f"You are not a member of team {team.slug}.")
    if idempotency_key:
        existing = Job.objects.filter(user=user, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing

    validation.check_options(options or {})
    network = validation.check_network(network)
    argv = validation.check_command(command)
    clean_env = validation.check_env(env)
    facts = selectors.submission_facts(team_id=team.pk, image=image if isinstance(image, str) else "")
    limits = limits_of(facts.policy)
    _refuse_if_queue_full(team, facts.queued, limits.max_queued_jobs)
    max_gpus = limits.max_gpus_per_job or 64
    gpu_count = _check_int("gpu_count", gpu_count, 1, max_gpus)
    models = validation.check_gpu_models(gpu_model, gpu_models)
    if pool is not None:
        if not isinstance(pool, str) or not pool:
            raise _field_error("pool", "pool must be a pool's name.")
        # The job runs where the pool's scheduler puts it: narrowed to the pool's models, which routes it there.
        models = pools_selectors.models_for_pool(pool, models)
    share = _check_part(mig_profile, gpu_share, gpu_count, mig_memory_mib, check_fleet=check_fleet)
    cpus_value = _check_cpus(conf.DEFAULT_CPUS if cpus is None else cpus)
    memory = _check_int(
        "memory_mib", conf.DEFAULT_MEMORY_MIB if memory_mib is None else memory_mib, 16, conf.MAX_MEMORY_MIB
    )
    duration = _check_int(
        "max_duration_s",
        conf.DEFAULT_MAX_DURATION_S if max_duration_s is None else max_duration_s,
        1,
        limits.max_duration_s,
    )
    top = conf.STAFF_MAX_PRIORITY if user.is_staff else limits.max_priority
    priority = _check_int("priority", 0 if priority is None else priority, conf.MIN_PRIORITY, top)
    if not isinstance(name, str) or len(name) > conf.MAX_NAME_CHARS:
        raise _field_error("name", f"name must be at most {conf.MAX_NAME_CHARS} characters.")
    container_image = _check_image(image, facts.image)
    clean_mounts = validation.check_mounts(mounts, container_image.allowed_mounts)
    quotas = None
    if reservation_id is None:
        # The team's quotas for the months the job may run in: read once, for the models and for the hold.
        begin = timezone.now()
        months = [m for m, _ in quota_math.split_by_month(begin, begin + timedelta(seconds=duration), local_tz())]
        quotas = booking_selectors.quotas_for(team_id=team.pk, months=months)
    if not models and reservation_id is None:
        # "Any model" means any model the team may use: narrowed here, the scheduler never places the job on a
        # model the quota excludes (an explicit model it excludes is refused by the quota hold below, 403).
        # A job bound to a reservation runs on the reservation's GPUs, which the quota allowed when booked.
        models = booking_selectors.allowed_model_names(team_id=team.pk, quotas=quotas)
    if check_fleet:
        _check_fleet_shape(gpu_count, models)
        if reservation_id is None and (mig_profile or share is not None):
            # A part the GPUs it may run on are not laid out to give (a job in a reservation runs on its parts).
            check_part_in_fleet(mig_profile=mig_profile or None, gpu_share=share, models=models)
    reservation = None
    if reservation_id is not None:
        reservation = _check_reservation(
            reservation_id, user=user, team=team, gpu_count=gpu_count, max_duration_s=duration
        )
        if mig_memory_mib is not None:
            raise _field_error("mig_memory_mib", "A job in a reservation runs on its parts: name none, or the profile.")
        mig_profile, share = _reserved_part(reservation, mig_profile or "", share, gpu_count)

    try:
        with transaction.atomic():
            if facts.queued >= limits.max_queued_jobs - _QUEUED_RECOUNT_MARGIN:
                # Near the limit, counted again in the write transaction (concurrent submissions may still pass
                # it together by a few, as with any count-then-insert).
                queued = Job.objects.filter(team=team, state=JobState.QUEUED).count()
                _refuse_if_queue_full(team, queued, limits.max_queued_jobs)
            now = timezone.now()
            job = Job(
                team=team,
                user=user,
                name=name.strip(),
                image=container_image.name,
                command=argv,
                env=clean_env,
                mounts=clean_mounts,
                gpu_count=gpu_count,
                gpu_models=models,
                mig_profile=mig_profile or "",
                gpu_share=share,
                mig_memory_mib=mig_memory_mib,
                cpus=cpus_value,
                memory_mib=memory,
                max_duration_s=duration,
                priority=priority,
                reservation=reservation,
                idempotency_key=idempotency_key or "",
            )
            job.save(force_insert=True)
            JobEvent.objects.create(job=job, at=now, from_state="", to_state=JobState.QUEUED)
            events.publish_state(job)
            events.broadcast_submitted_on_commit(job)
            if reservation is None:
                # A job inside a reservation runs on hours the reservation already counted.
                occupancy.quota_hold(job=job, start=now, end=now + timedelta(seconds=duration), quotas=quotas)
            events.wake_scheduler_on_commit("submitted")
    except IntegrityError:
        if idempotency_key:
            existing = Job.objects.filter(user=user, idempotency_key=idempotency_key).first()
            if existing is not None:
                return existing
        raise
    logger.info("job %s queued by %s for team %s", job.pk, user, team.slug)
    return job
