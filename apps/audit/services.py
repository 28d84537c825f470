"""Write audit entries. Call inside the transaction of the change, so the entry exists iff the change does.

This module is the one writer of audit rows: `audit_record` saves one; `audit_event` builds the same row unsaved
for a writer that inserts it within its own statement."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import AnyUser, User
from apps.audit.models import AuditEvent


def audit_event(
    *,
    actor: AnyUser | None,
    action: str,
    target: models.Model | None = None,
    team: Team | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """The audit row for a change, unsaved, every column set (its time is now). `team` defaults to the target's
    team; an actor who is not signed in (the system, a task) is recorded as none. The target needs its primary
    key already."""
    team_id = team.pk if team is not None else getattr(target, "team_id", None)
    return AuditEvent(
        created_at=timezone.now(),
        actor=actor if isinstance(actor, User) else None,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:200] if target is not None else "",
        team_id=team_id,
        data=data or {},
    )


def audit_record(
    *,
    actor: AnyUser | None,
    action: str,
    target: models.Model | None = None,
    team: Team | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write the audit row for a change (see `audit_event`)."""
    event = audit_event(actor=actor, action=action, target=target, team=team, data=data)
    event.save(force_insert=True)
    return event
