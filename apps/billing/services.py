"""Writes for billing: the ledger closer, prices (and list-price sync), month close and re-open, budget alerts,
live cost broadcasts.

Locks: every write to the ledger, to prices and to month closes happens inside `transaction.atomic()` holding the
ledger lock (`pg_advisory_xact_lock(LEDGER_LOCK_KEY)`). The lock only serializes billing's own writers: the ledger's
idempotency does not depend on it, the unique key of `UsageRecord` does (rows are inserted with ON CONFLICT DO
NOTHING, so two closers that raced past the lock would still write each piece once).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.models import Membership, Role, Team
from apps.accounts.types import AnyUser, User
from apps.audit.services import audit_record
from apps.billing import conf, costing, selectors
from apps.billing.models import (
    BudgetAlert,
    MonthClose,
    MonthStatus,
    Notification,
    NotificationLevel,
    Price,
    SourceKind,
    UsageRecord,
)
from apps.core.errors import Conflict, Forbidden, ValidationFailed
from apps.events.models import MailPreference
from apps.events.services import publish
from apps.fleet.models import GpuModel

logger = logging.getLogger(__name__)

LEDGER_LOCK_KEY = 0x42494C4C  # "BILL"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LIVE_KEY = "billing:live:{team_id}"  # the last figures pushed to a team's sockets (Redis string)
LIVE_TEAMS = "billing:live-teams"  # teams whose figures were moving at the last broadcast (Redis set)


def team_group(team_id: int) -> str:
    """Channel-layer group of a team's cost sockets."""
    return f"billing.team.{team_id}"


def _ledger_lock() -> None:
    """Serialize billing's writers (see the module docstring). Call inside transaction.atomic()."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LEDGER_LOCK_KEY])


# --- The ledger ------------------------------------------------------------------------------------------------


def ledger_rows_due(
    *, now: datetime, allocation_ids: Iterable[int] | None = None, team_ids: Iterable[int] | None = None
) -> list[UsageRecord]:
    """Unsaved ledger rows for every piece that is over (ended at least CLOSE_LAG_S ago), lies in an open month
    and has no row yet, with the GPU's mean utilization over the piece."""
    horizon = now - timedelta(seconds=conf.CLOSE_LAG_S)
    closed = selectors.closed_months()
    allocations = selectors.unbilled_allocations(
        now=now, allocation_ids=allocation_ids, team_ids=team_ids, since=selectors.open_since()
    )
    book = selectors.price_book(gpu_model_ids={a.gpu_model_id for a in allocations})
    pieces = [
        (alloc, piece)
        for alloc, piece in selectors.unbilled_pieces(allocations, book=book)
        if piece.end <= horizon and piece.month not in closed
    ]
    utilizations = selectors.mean_utilizations([(a.gpu_id, p.start, p.end) for a, p in pieces])
    # A job on a share or MIG instance: its own SM activity, where its node read it, wins over the device's rollups
    # (a share has none of its own: the GPU's utilization is all its holders' together).
    on_parts = [i for i, (a, _) in enumerate(pieces) if a.parent_id is not None and a.source == SourceKind.JOB]
    own = selectors.job_part_utilizations(
        [(pieces[i][0].source_id, pieces[i][0].parent_id or 0, pieces[i][1].start, pieces[i][1].end) for i in on_parts]
    )
    for i, value in zip(on_parts, own, strict=True):
        if value is not None:
            utilizations[i] = value
    # A reservation of shares: its holder's own work, where its neighbours' can be taken out (the selector says).
    held = [
        i
        for i, (a, _) in enumerate(pieces)
        if a.parent_id is not None and not a.profile and a.source == SourceKind.RESERVATION
    ]
    theirs = selectors.reservation_part_utilizations(
        [(pieces[i][0].source_id, pieces[i][0].parent_id or 0, pieces[i][1].start, pieces[i][1].end) for i in held]
    )
    for i, value in zip(held, theirs, strict=True):
        if value is not None and utilizations[i] is None:
            utilizations[i] = value
    return [
        UsageRecord(
            team_id=alloc.team_id,
            user_id=alloc.user_id,
            gpu_id=alloc.gpu_id,
            gpu_model_id=alloc.gpu_model_id,
            source=alloc.source,
            source_id=alloc.source_id,
            allocation_id=alloc.id,
            start=piece.start,
            end=piece.end,
            day=piece.day,
            month=piece.month,
            gpu_seconds=piece.seconds,
            share=alloc.share,
            hourly_price=piece.hourly_price,
            cost=piece.cost,
            mean_utilization=utilization,
            end_reason=alloc.end_reason if piece.end == alloc.end else "",
        )
        for (alloc, piece), utilization in zip(pieces, utilizations, strict=True)
    ]


def ledger_insert(rows: Sequence[UsageRecord]) -> None:
    """Append rows; the database skips any whose (source, source_id, gpu, start) exists (ON CONFLICT DO NOTHING).
    This, not a lock or a check in Python, is what makes a replayed or doubled close bill each piece once."""
    UsageRecord.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)


def ledger_close(*, now: datetime | None = None, allocation_ids: Iterable[int] | None = None) -> int:
    """Write the ledger rows of every piece that is over (idempotent; the beat task runs it every minute).
    Returns how many rows were due; a concurrent run that got there first makes the database skip them."""
    now = now or timezone.now()
    with transaction.atomic():
        _ledger_lock()
        rows = ledger_rows_due(now=now, allocation_ids=allocation_ids)
        ledger_insert(rows)
    return len(rows)


# --- Prices --------------------------------------------------------------------------------------------------------


def _as_instant(valid_from: datetime | date) -> datetime:
    if isinstance(valid_from, datetime):
        try:
            return costing.truncate_to_second(valid_from)
        except ValueError:
            raise ValidationFailed(
                "valid_from needs a time zone.", fields={"valid_from": ["Give an offset, e.g. +00:00."]}
            ) from None
    return costing.local_midnight(valid_from, selectors.local_tz())


def _closed_months_touching(start: datetime, end: datetime | None) -> list[date]:
    tz = selectors.local_tz()
    out = []
    for month in sorted(selectors.closed_months()):
        first, after = costing.month_bounds(month, tz)
        if after > start and (end is None or first < end):
            out.append(month)
    return out


def price_validate(*, gpu_model: GpuModel, valid_from: datetime | date, hourly_price: Any) -> tuple[datetime, Decimal]:
    """Check a price change without writing it: a non-negative amount with at most 4 decimals, and a date whose
    validity period (until the model's next price) touches no closed month. Returns (instant, price)."""
    try:
        price = Decimal(str(hourly_price))
    except (InvalidOperation, ValueError):
        raise ValidationFailed("hourly_price must be a number.", fields={"hourly_price": ["A number."]}) from None
    if not price.is_finite() or price < 0 or price >= Decimal("1e8"):
        raise ValidationFailed("hourly_price must be between 0 and 99999999.", fields={"hourly_price": ["0-99999999."]})
    if price != price.quantize(Decimal("0.0001")):
        raise ValidationFailed("hourly_price has at most 4 decimals.", fields={"hourly_price": ["At most 4 decimals."]})
    instant = _as_instant(valid_from)
    following = (
        Price.objects.filter(gpu_model=gpu_model, valid_from__gt=instant)
        .order_by("valid_from")
        .values_list("valid_from", flat=True)
        .first()
    )
    closed = _closed_months_touching(instant, following)
    if closed:
        labels = ", ".join(selectors.month_label(m) for m in closed)
        raise ValidationFailed(
            f"A price from {instant:%Y-%m-%d %H:%M} UTC would change the closed month(s) {labels}; closed months "
            "never change (an administrator may re-open one).",
            code="month_closed",
            fields={"valid_from": [f"Inside or before the closed month(s) {labels}."]},
        )
    return instant, price


def price_set(
    *,
    actor: AnyUser,
    gpu_model: GpuModel,
    hourly_price: Any,
    valid_from: datetime | date,
    note: str = "",
    now: datetime | None = None,
) -> Price:
    """Set a GPU model's price from `valid_from` on (a date means local midnight). Refused (400 `month_closed`)
    when it would change a closed month. A change dated into the open month re-rates that month's rows from it:
    they are deleted and written again from their allocations at the new price, in this transaction (the one
    place rows are replaced; audited). Holds the ledger lock."""
    now = now or timezone.now()
    with transaction.atomic():
        _ledger_lock()
        instant, price = price_validate(gpu_model=gpu_model, valid_from=valid_from, hourly_price=hourly_price)
        if not Price.objects.filter(gpu_model=gpu_model).exists() and instant > EPOCH:
            # Until now the model was billed at its list price: make that the first point of its timeline, so
            # what was billed before this change keeps its meaning.
            Price.objects.create(
                gpu_model=gpu_model,
                valid_from=EPOCH,
                hourly_price=gpu_model.hourly_price,
                note="list price before the first price change",
                created_by=None,
            )
        previous = Price.objects.filter(gpu_model=gpu_model, valid_from=instant).first()
        row, _ = Price.objects.update_or_create(
            gpu_model=gpu_model,
            valid_from=instant,
            defaults={"hourly_price": price, "note": note[:200], "created_by": _user_or_none(actor)},
        )
        following = (
            Price.objects.filter(gpu_model=gpu_model, valid_from__gt=instant)
            .order_by("valid_from")
            .values_list("valid_from", flat=True)
            .first()
        )
        stale = UsageRecord.objects.filter(gpu_model=gpu_model, end__gt=instant, allocation__isnull=False)
        if following is not None:
            stale = stale.filter(start__lt=following)
        allocation_ids = set(stale.values_list("allocation_id", flat=True))
        removed, _ = stale.delete()
        rewritten = ledger_rows_due(now=now, allocation_ids=allocation_ids) if allocation_ids else []
        ledger_insert(rewritten)
        audit_record(
            actor=actor,
            action="billing.price_set",
            target=row,
            data={
                "gpu_model": gpu_model.name,
                "valid_from": instant.isoformat(),
                "hourly_price": str(price),
                "previous_at_same_instant": None if previous is None else str(previous.hourly_price),
                "rerated_rows_removed": removed,
                "rerated_rows_written": len(rewritten),
            },
        )
        transaction.on_commit(lambda: list_prices_sync())
    return row


def list_prices_sync(*, now: datetime | None = None) -> int:
    """Make each GPU model's list price (GpuModel.hourly_price, shown by /api/v1/gpu-models/) the price in force
    now. Conditional UPDATEs: a model already in sync is not written. Returns how many changed."""
    now = now or timezone.now()
    changed = 0
    for model_id, points in selectors.price_points().items():
        current = costing.price_at(points, now)
        if current is None:
            continue
        changed += GpuModel.objects.filter(pk=model_id).exclude(hourly_price=current).update(hourly_price=current)
    return changed


def _user_or_none(actor: AnyUser | None) -> User | None:
    return actor if isinstance(actor, User) else None


# --- Month close ---------------------------------------------------------------------------------------------------


def month_close(*, month: date, actor: AnyUser | None = None, now: datetime | None = None) -> MonthClose:
    """Freeze a month that is over: write its last ledger rows, then store its report figures. Idempotent (a
    closed month is returned as it is); re-closing a re-opened month freezes its figures again. Holds the ledger
    lock, so no row can land in the month between the last write and the freeze."""
    now = now or timezone.now()
    month = month.replace(day=1)
    _, after = costing.month_bounds(month, selectors.local_tz())
    if after + timedelta(seconds=conf.CLOSE_LAG_S) > now:
        raise ValidationFailed(f"{selectors.month_label(month)} is not over yet.", fields={"month": ["Not over yet."]})
    with transaction.atomic():
        _ledger_lock()
        existing = MonthClose.objects.select_for_update().filter(month=month).first()
        if existing is not None and existing.status == MonthStatus.CLOSED:
            return existing
        ledger_insert(ledger_rows_due(now=now))
        figures = selectors.report_figures(month=month)
        totals = selectors.sum_aggs(agg for team in figures["teams"].values() for agg in team["by_gpu_model"].values())
        values = {
            "status": MonthStatus.CLOSED,
            "figures": json.loads(json.dumps(figures)),
            "cost": Decimal(totals.get("cost", "0")),
            "gpu_seconds": int(totals.get("seconds", 0)),
            "closed_at": now,
            "closed_by": _user_or_none(actor),
        }
        if existing is None:
            closing = MonthClose.objects.create(month=month, **values)
        else:
            closing = existing
            for key, value in values.items():
                setattr(closing, key, value)
            closing.save()
        audit_record(
            actor=actor,
            action="billing.month_close",
            target=closing,
            data={
                "month": selectors.month_label(month),
                "cost": str(closing.cost),
                "gpu_seconds": closing.gpu_seconds,
                "reclosed": existing is not None,
            },
        )
    return closing


def month_reopen(*, month: date, actor: AnyUser, reason: str = "") -> MonthClose:
    """Re-open a closed month (administrators): its rows may be written again and prices dated into it are
    accepted, until it is closed again. Audited with the figures it had. Holds the ledger lock."""
    if not getattr(actor, "is_staff", False):
        raise Forbidden("Only administrators may re-open a month.")
    month = month.replace(day=1)
    with transaction.atomic():
        _ledger_lock()
        closing = MonthClose.objects.select_for_update().filter(month=month).first()
        if closing is None or closing.status != MonthStatus.CLOSED:
            raise Conflict(f"{selectors.month_label(month)} is not closed.")
        closing.status = MonthStatus.REOPENED
        closing.reopened_at = timezone.now()
        closing.reopened_by = _user_or_none(actor)
        closing.save(update_fields=["status", "reopened_at", "reopened_by"])
        audit_record(
            actor=actor,
            action="billing.month_reopen",
            target=closing,
            data={"month": selectors.month_label(month), "reason": reason[:500], "frozen_cost": str(closing.cost)},
        )
    return closing


def months_due_for_close(*, now: datetime) -> list[date]:
    """Months that are over, have no close yet (closed or re-opened), and either are the previous month or hold
    ledger rows. A re-opened month waits for an administrator to close it again."""
    this_month = selectors.current_month(now=now)
    candidates = {costing.previous_month(this_month)}
    candidates.update(UsageRecord.objects.filter(month__lt=this_month).values_list("month", flat=True).distinct())
    known = set(MonthClose.objects.values_list("month", flat=True))
    tz = selectors.local_tz()
    lag = timedelta(seconds=conf.CLOSE_LAG_S)
    return sorted(m for m in candidates - known if costing.month_bounds(m, tz)[1] + lag <= now)


def close_due_months(*, now: datetime | None = None) -> list[date]:
    """Close every month that is due (the beat task, hourly; the first run after a month ends freezes it)."""
    now = now or timezone.now()
    done = []
    for month in months_due_for_close(now=now):
        month_close(month=month, actor=None, now=now)
        done.append(month)
    return done


# --- Budgets -------------------------------------------------------------------------------------------------------


def budget_check(
    *, team_id: int, usage: selectors.MonthUsage | None = None, now: datetime | None = None
) -> list[BudgetAlert]:
    """Fire the team's budget alerts its month-to-date cost has reached (80% and 100% of its budget), each at most
    once per month: the unique (team, month, threshold) row decides who fires, so concurrent checks cannot both.
    A new alert writes a portal notification and, after commit, e-mails the team's managers."""
    now = now or timezone.now()
    usage = usage or selectors.team_month_usage(team_id=team_id, now=now)
    budget = selectors.team_budget(team_id=team_id, month=usage.month).reference
    if not budget or budget <= 0:
        return []
    reached = [t for t in conf.BUDGET_THRESHOLDS if usage.cost * 100 >= budget * t]
    if not reached:
        return []
    done = set(
        BudgetAlert.objects.filter(team_id=team_id, month=usage.month, threshold__in=reached).values_list(
            "threshold", flat=True
        )
    )
    fired: list[BudgetAlert] = []
    for threshold in (t for t in reached if t not in done):
        with transaction.atomic():
            alert, created = BudgetAlert.objects.get_or_create(
                team_id=team_id,
                month=usage.month,
                threshold=threshold,
                defaults={"budget": budget, "cost": usage.cost},
            )
            if not created:
                continue
            notification = _budget_notification(alert)
            publish(
                "budget.threshold",
                team_id=team_id,
                subject=f"teams/{team_id}/budget/{alert.month:%Y-%m}",
                data={"threshold": threshold, "month": f"{alert.month:%Y-%m}", "budget": str(budget),
                      "cost": str(alert.cost), "currency": settings.PORTAL_CURRENCY},
            )  # fmt: skip
            transaction.on_commit(functools.partial(_after_budget_alert, alert.pk, notification.pk))
            fired.append(alert)
    return fired


def _budget_notification(alert: BudgetAlert) -> Notification:
    team = Team.objects.get(pk=alert.team_id)
    label = f"{alert.month:%B %Y}"
    spent = f"{costing.to_cents(alert.cost)} {settings.PORTAL_CURRENCY}"
    of = f"{alert.budget} {settings.PORTAL_CURRENCY}"
    if alert.threshold >= 100:
        title = f"{team.slug} has used its whole {label} budget"
        body = f"Month-to-date cost {spent} has reached the budget of {of}."
    else:
        title = f"{team.slug} has used {alert.threshold}% of its {label} budget"
        body = f"Month-to-date cost {spent} of a {of} budget."
    budget = selectors.team_budget(team_id=team.pk, month=alert.month)
    if budget.hard is not None:
        body += f" At the hard limit of {budget.hard} {settings.PORTAL_CURRENCY} new bookings and jobs are refused."
    return Notification.objects.create(
        team=team,
        level=NotificationLevel.DANGER if alert.threshold >= 100 else NotificationLevel.WARNING,
        title=title,
        body=body,
        link=f"/costs/teams/{team.slug}/",
    )


def _after_budget_alert(alert_id: int, notification_id: int) -> None:
    """After commit: e-mail the managers and push the notification to the team's sockets. Failures are logged, not
    raised: the alert row and the portal notification exist either way."""
    alert = BudgetAlert.objects.select_related("team").filter(pk=alert_id).first()
    notification = Notification.objects.filter(pk=notification_id).first()
    if alert is None or notification is None:
        return
    # This is the budget mail (the events outbox does not mail budget.threshold): every manager of the team,
    # unless they turned "budget thresholds" off in their mail preferences (on for anyone without preferences).
    opted_out = MailPreference.objects.filter(budget_thresholds=False).values("user_id")
    recipients = sorted(
        {
            email
            for email in Membership.objects.filter(team_id=alert.team_id, role=Role.MANAGER)
            .exclude(user_id__in=opted_out)
            .values_list("user__email", flat=True)
            if email
        }
    )
    if recipients:
        try:
            send_mail(
                subject=f"[{settings.PORTAL_NAME}] {notification.title}",
                message=f"{notification.body}\n\nSee {notification.link}",
                from_email=settings.DEFAULT_FROM_EMAIL,
                recipient_list=recipients,
            )
        except Exception:
            logger.exception("budget alert %s: e-mail to %s failed", alert_id, recipients)
    _group_send(
        alert.team_id,
        {
            "type": "team_notification",
            "data": {"level": notification.level, "title": notification.title, "body": notification.body},
        },
    )


# --- Live month-to-date broadcasts --------------------------------------------------------------------------------


def _group_send(team_id: int, message: dict[str, Any]) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(team_group(team_id), message)
    except Exception:
        logger.warning("billing: could not push to team %s's sockets", team_id, exc_info=True)


def _signature(payload: dict[str, Any]) -> str:
    keys = ("month", "cost", "gpu_hours", "running_gpus", "running_gpu_share", "budget_soft", "budget_hard")
    return json.dumps([payload.get(k) for k in keys])


def broadcast_team_costs(*, now: datetime | None = None) -> list[int]:
    """Push month-to-date cost and GPU-hours to the sockets of every team whose figures move (a running or not yet
    written allocation), when they changed since the last push; a team that just stopped moving gets one last
    push. Also fires the budget alerts those figures reach. Returns the teams pushed to."""
    from apps.core.redis import get_redis

    now = now or timezone.now()
    moving = selectors.teams_with_unbilled_time(now=now)
    redis: Any = get_redis()
    try:
        was_moving = {int(t) for t in redis.smembers(LIVE_TEAMS)}
    except Exception:
        logger.warning("billing: Redis unavailable; live costs not pushed", exc_info=True)
        was_moving = set()
        redis = None
    team_ids = sorted(set(moving) | was_moving)
    if not team_ids:
        return []
    usage = selectors.teams_month_usage(team_ids=team_ids, now=now)
    teams = Team.objects.in_bulk(team_ids)
    pushed = []
    for tid in team_ids:
        if tid not in teams:
            continue
        budget_check(team_id=tid, usage=usage[tid], now=now)
        payload = selectors.usage_payload(
            teams[tid], usage[tid], selectors.team_budget(team_id=tid, month=usage[tid].month), now
        )
        signature = _signature(payload)
        key = LIVE_KEY.format(team_id=tid)
        try:
            if redis is not None and redis.get(key) == signature.encode():
                continue
            if redis is not None:
                redis.set(key, signature, ex=3600)
        except Exception:
            logger.warning("billing: Redis unavailable", exc_info=True)
        _group_send(tid, {"type": "team_usage", "data": payload})
        pushed.append(tid)
    if redis is not None:
        try:
            pipe = redis.pipeline()
            pipe.delete(LIVE_TEAMS)
            if moving:
                pipe.sadd(LIVE_TEAMS, *moving)
            pipe.execute()
        except Exception:
            logger.warning("billing: Redis unavailable", exc_info=True)
    return pushed
