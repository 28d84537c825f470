"""Write audit entries. Call inside the transaction of the change, so the entry exists iff the change does."""

from __future__ import annotations

from typing import Any

from django.db import models

from apps.audit.models import AuditEvent


def audit_record(
    *,
    actor: Any | None,
    action: str,
    target: models.Model | None = None,
    team: Any | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    if team is None and target is not None:
        team_id = getattr(target, "team_id", None)
    else:
        team_id = getattr(team, "pk", None)
    actor_obj = actor if getattr(actor, "is_authenticated", False) else None
    return AuditEvent.objects.create(
        actor=actor_obj,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:200] if target is not None else "",
        team_id=team_id,
        data=data or {},
    )
