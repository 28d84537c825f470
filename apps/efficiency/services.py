"""Writes for efficiency: the idle scan (warn, reclaim, release unused), the team's idle policy.

The scan runs from beat (`efficiency.idle_scan`). Every move is a conditional write: a mark moves to `warned`
only from another state, a reservation is released only while active (its row locked), a job is asked to stop
only while on its node, so two scans running at once do each move once. Warnings and reclaims publish
`idle.warning` / `idle.reclaimed` (webhooks and mail, from the outbox) and push a live message to the team's
sockets after commit (the banner on every page).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser
from apps.audit.services import audit_record
from apps.billing.selectors.pricing import price_at
from apps.billing.selectors.unbilled import mig_profile_prices
from apps.billing.services import team_group
from apps.booking.hooks import ReservationRehomed
from apps.booking.services.reservations import reservation_release_by_portal
from apps.core.errors import Forbidden, ValidationFailed
from apps.efficiency import conf, detector, selectors
from apps.efficiency.models import IdleMark, IdlePolicy, MarkState
from apps.events.services import publish
from apps.fleet.models import DeviceKind, Gpu
from apps.jobs import conf as jobs_conf
from apps.jobs.models import Job, JobReason
from apps.jobs.services.transitions import job_request_stop

logger = logging.getLogger(__name__)

APPLIES_TO = ("reservations", "jobs")
_Q = Decimal("0.0001")


@dataclass
class ScanResult:
    warned: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)


def push_live(team_id: int, data: dict[str, Any]) -> None:
    """After commit: a `team.notification` on the team's sockets (the banner script filters by user)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(team_group(team_id), {"type": "team.notification", "data": data})
    except Exception:
        logger.warning("efficiency: could not push to team %s's sockets", team_id, exc_info=True)


def tell_rehomed(event: ReservationRehomed) -> None:
    """A booking.hooks handler: the holder's open pages show that a layout change (or a GPU gone from its node)
    moved or ended their booking."""
    push_live(
        event.team_id,
        {
            "event": "layout.ended" if event.ended else "layout.moved",
            "kind": "reservation",
            "id": event.reservation_id,
            "user_id": event.user_id,
            "reason": event.reason,
            "message": event.message,
        },
    )


def _subject(item: selectors.Watched) -> str:
    return f"{item.kind}s/{item.source_id}"


def _device_count(gpu_ids: tuple[int, ...]) -> int:
    """The GPUs and instances held, as bookings count them: the shares of one GPU are one GPU."""
    rows = Gpu.devices.filter(pk__in=gpu_ids).values_list("pk", "kind", "parent_id")
    return len({parent if kind == DeviceKind.SHARE and parent is not None else pk for pk, kind, parent in rows})


def _handed_back(gpu_ids: tuple[int, ...], hours_left: Decimal, now: datetime) -> tuple[Decimal, Decimal]:
    """The GPU-hours and cost handed back: `hours_left` on each GPU, a MIG instance or share counted at its share of
    its GPU and priced as billing prices it (the admins' price of the MIG profile, else the GPU's price x share)."""
    rows = list(Gpu.devices.filter(pk__in=gpu_ids).values_list("model_id", "capacity", "mig_profile"))
    profile_prices = mig_profile_prices() if any(profile for _, _, profile in rows) else {}
    gpu_hours, cost = Decimal(0), Decimal(0)
    for model_id, capacity, profile in rows:
        share = Decimal(capacity)
        gpu_hours += hours_left * share
        override = profile_prices.get((model_id, profile)) if profile else None
        cost += hours_left * (override if override is not None else price_at(gpu_model_id=model_id, at=now) * share)
    return gpu_hours.quantize(_Q), cost.quantize(_Q)


def _warn(item: selectors.Watched, v: detector.Verdict, now: datetime) -> bool:
    reclaim_at = now + timedelta(minutes=v.grace_min)
    fields: dict[str, Any] = {
        "state": MarkState.WARNED,
        "warned_at": now,
        "idle_since": now - timedelta(minutes=v.window_min),
        "reclaim_at": reclaim_at,
        "loaded": v.loaded,
        "gpu_count": _device_count(item.gpu_ids),
        "team_id": item.team_id,
        "user_id": item.user_id,
    }
    with transaction.atomic():
        moved = (
            IdleMark.objects.filter(kind=item.kind, source_id=item.source_id)
            .exclude(state__in=[MarkState.WARNED, MarkState.RECLAIMED, MarkState.UNUSED])
            .update(**fields)
        )
        if not moved:
            if IdleMark.objects.filter(kind=item.kind, source_id=item.source_id).exists():
                return False
            try:
                with transaction.atomic():
                    IdleMark.objects.create(kind=item.kind, source_id=item.source_id, **fields)
            except IntegrityError:  # another scan created it first: that scan warns
                return False
        data: dict[str, object] = {
            "kind": item.kind,
            "id": item.source_id,
            "window_minutes": v.window_min,
            "mean_utilization": round(v.window_mean or 0.0, 2),
            "loaded": v.loaded,
            "reclaim_at": reclaim_at.isoformat(),
            "gpus": fields["gpu_count"],
        }
        audit_record(actor=None, action="idle.warning", team=Team(pk=item.team_id), data={**data, "why": v.why})
        publish("idle.warning", team_id=item.team_id, subject=_subject(item), data=data, user_id=item.user_id)
        live = {**data, "event": "idle.warning", "user_id": item.user_id}
        transaction.on_commit(lambda: push_live(item.team_id, live))
    return True


def _reclaim(item: selectors.Watched, v: detector.Verdict, now: datetime) -> bool:
    why = {"window_minutes": v.window_min, "grace_minutes": v.grace_min, "loaded": v.loaded, "why": v.why}
    with transaction.atomic():
        if item.kind == "reservation":
            released = reservation_release_by_portal(reservation_id=item.source_id, reason="idle", data=why, now=now)
            if released is None:
                return False
            left = Decimal(max((released.booked_end - now).total_seconds(), 0)) / 3600
        else:
            job = Job.objects.select_related("node").filter(pk=item.source_id).first()
            if job is None or job.stop_reason:
                return False
            job_request_stop(job=job, reason=JobReason.IDLE, grace_s=jobs_conf.CANCEL_GRACE_S)
            if not Job.objects.filter(pk=job.pk, stop_reason=JobReason.IDLE).exists():
                return False  # no longer on its node: it ended on its own
            until = (job.started_at or now) + timedelta(seconds=job.max_duration_s)
            left = Decimal(max((until - now).total_seconds(), 0)) / 3600
            audit_record(actor=None, action="job.idle_stop", target=job, data=why)
        hours, cost = _handed_back(item.gpu_ids, left, now)
        IdleMark.objects.filter(kind=item.kind, source_id=item.source_id).update(
            state=MarkState.RECLAIMED, reclaimed_at=now, reclaimed_gpu_hours=hours, reclaimed_cost=cost
        )
        data: dict[str, object] = {"kind": item.kind, "id": item.source_id, **why, "gpu_hours": str(hours)}
        publish("idle.reclaimed", team_id=item.team_id, subject=_subject(item), data=data, user_id=item.user_id)
        live = {**data, "event": "idle.reclaimed", "user_id": item.user_id}
        transaction.on_commit(lambda: push_live(item.team_id, live))
    return True


def _release_unused(item: selectors.Watched, now: datetime, th: detector.Thresholds) -> bool:
    why = {"unused_minutes": th.unused_release_after_min}
    with transaction.atomic():
        released = reservation_release_by_portal(reservation_id=item.source_id, reason="unused", data=why, now=now)
        if released is None:
            return False
        hours, cost = _handed_back(
            item.gpu_ids, Decimal(max((released.booked_end - now).total_seconds(), 0)) / 3600, now
        )
        IdleMark.objects.update_or_create(
            kind=item.kind,
            source_id=item.source_id,
            defaults={
                "team_id": item.team_id,
                "user_id": item.user_id,
                "state": MarkState.UNUSED,
                "gpu_count": _device_count(item.gpu_ids),
                "reclaimed_at": now,
                "reclaimed_gpu_hours": hours,
                "reclaimed_cost": cost,
            },
        )
        data: dict[str, object] = {"kind": item.kind, "id": item.source_id, "reason": "unused", **why}
        publish("idle.reclaimed", team_id=item.team_id, subject=_subject(item), data=data, user_id=item.user_id)
        live = {**data, "event": "idle.reclaimed", "user_id": item.user_id}
        transaction.on_commit(lambda: push_live(item.team_id, live))
    return True


def _history_needed(th: detector.Thresholds) -> int:
    return detector.window_of(th, loaded=True) + th.reclaim_after_min


def idle_scan(*, now: datetime | None = None) -> ScanResult:
    """Judge every active reservation and running job against its team's policy, from the minute rollups."""
    now = now or timezone.now()
    result = ScanResult()
    pols = selectors.policies()
    items = [it for it in selectors.watched(now=now) if selectors.applies(pols.get(it.team_id), it.kind)]
    if not items:
        return result
    extras = selectors.exemptions(items)
    marks = selectors.marks(items)
    # Enough history for the longest limit (loaded, with an interactive extra) and for the unused window.
    longest = max(
        [max(_history_needed(selectors.thresholds_of(p)), p.unused_release_after_min) for p in pols.values()]
        + [_history_needed(detector.Thresholds())]
    ) + max([e or 0 for e in extras.values()] + [0])
    horizon = now - timedelta(minutes=longest + conf.FRESH_WITHIN_MIN)
    since = min(max(it.start, horizon) for it in items)
    samples = selectors.minute_samples(gpu_ids={g for it in items for g in it.gpu_ids}, since=since, until=now)
    samples = selectors.with_share_jobs_own_minutes(items, samples, since=since, until=now)
    samples = selectors.with_share_reservations_own_minutes(items, samples, since=since, until=now)
    fresh = timedelta(minutes=conf.FRESH_WITHIN_MIN)
    for it in items:
        th = selectors.thresholds_of(pols.get(it.team_id))
        since = max(it.start, horizon)
        minutes = selectors.allocation_minutes(it, samples, th, since=since, now=now, fresh_within=fresh)
        if not minutes:
            continue
        key = (it.kind, it.source_id)
        mark = marks.get(key)
        if mark is not None and mark.state in (MarkState.RECLAIMED, MarkState.UNUSED):
            continue
        if it.kind == "reservation" and since == it.start and mark is None and detector.unused(minutes, th):
            if _release_unused(it, now, th):
                result.unused.append(_subject(it))
            continue
        warned_for = None
        if mark is not None and mark.state == MarkState.WARNED and mark.warned_at is not None:
            warned_for = int((now - mark.warned_at).total_seconds() // 60)
        v = detector.decide(minutes, th, warned_for=warned_for, extra_min=extras.get(key, 0))
        if v.action == detector.Action.WARN and _warn(it, v, now):
            result.warned.append(_subject(it))
        elif v.action == detector.Action.RECLAIM and _reclaim(it, v, now):
            result.reclaimed.append(_subject(it))
        elif (
            v.action == detector.Action.CLEAR
            and mark is not None
            and IdleMark.objects.filter(pk=mark.pk, state=MarkState.WARNED).update(state=MarkState.CLEARED)
        ):
            result.cleared.append(_subject(it))
    return result


def _check_policy_input(data: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    limits = {
        "warn_after_min": (1, 7 * 24 * 60),
        "reclaim_after_min": (1, 7 * 24 * 60),
        "unused_release_after_min": (0, 7 * 24 * 60),
        "utilization_below_pct": (0, 100),
        "memory_below_pct": (0, 100),
    }
    for name, (lo, hi) in limits.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            fields[name] = [f"A whole number from {lo} to {hi}."]
        else:
            clean[name] = value
    if "applies_to" in data:
        value = data["applies_to"]
        if not isinstance(value, list) or any(v not in APPLIES_TO for v in value):
            fields["applies_to"] = ['A list of "reservations" and/or "jobs".']
        else:
            clean["applies_to"] = sorted(set(value))
    if "enabled" in data:
        if not isinstance(data["enabled"], bool):
            fields["enabled"] = ["true or false."]
        else:
            clean["enabled"] = data["enabled"]
    unknown = set(data) - set(limits) - {"applies_to", "enabled"}
    for name in unknown:
        fields[name] = ["Unknown field."]
    if fields:
        raise ValidationFailed("Invalid idle policy.", fields=fields)
    return clean


def idle_policy_update(*, user: AnyUser, team: Team, data: dict[str, Any]) -> IdlePolicy:
    """Admins set a team's idle policy (partial update; audited with the changed values)."""
    if not user.is_staff:
        raise Forbidden("Only admins may change a team's idle policy.")
    clean = _check_policy_input(data)
    with transaction.atomic():
        policy, _ = IdlePolicy.objects.select_for_update().get_or_create(team=team)
        for name, value in clean.items():
            setattr(policy, name, value)
        policy.save()
        audit_record(actor=user, action="idle_policy.update", target=policy, team=team, data=clean)
    return policy
