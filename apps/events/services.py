"""Write events and webhook endpoints.

`publish` is the one entry point for the rest of the portal: call it inside the transaction of the change, so the
event exists iff the change does (the outbox pattern). Delivery to webhooks and mail happens from the outbox in
Celery, after commit, and again from the periodic sweep for anything a lost message left owed."""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.scoping import managed_team_ids_of, team_ids_of
from apps.accounts.types import User
from apps.audit.services import audit_record
from apps.core.errors import Conflict, Forbidden, NotFound, ValidationFailed
from apps.events import secrets
from apps.events.matching import pattern_is_valid
from apps.events.models import MailPreference, OutboxEvent, WebhookEndpoint
from apps.events.nudge import nudge
from apps.events.selectors import webhook_get
from apps.events.ssrf import UnsafeUrl, check_url


def publish(
    event_type: str,
    *,
    team_id: int | None,
    subject: str,
    data: dict[str, object],
    user_id: int | None = None,
) -> None:
    """Record `event_type` (e.g. "job.succeeded") about `subject` (e.g. "jobs/42") for the team's webhooks and
    the user's mail. Writes one row in the caller's transaction; the fan-out task is sent after commit."""
    event = OutboxEvent.objects.create(
        created_at=timezone.now(),
        event_type=event_type,
        team_id=team_id,
        user_id=user_id,
        subject=subject[:200],
        data=data,
    )
    event_id = event.pk
    transaction.on_commit(lambda: nudge(event_id))


def _manageable_team(*, user: User, team_slug: str | None) -> Team | None:
    """The team an endpoint is for, checked: admins any team or none (every team); managers their own teams."""
    if team_slug is None:
        if not user.is_staff:
            raise ValidationFailed(
                "Only administrators may register a webhook for every team.",
                fields={"team": ["Name one of the teams you manage."]},
            )
        return None
    team = Team.objects.filter(slug=team_slug).first()
    if team is None or not (user.is_staff or team.pk in team_ids_of(user)):
        raise ValidationFailed("No such team.", fields={"team": [f"No team {team_slug!r} of yours."]})
    if not user.is_staff and team.pk not in managed_team_ids_of(user):
        raise Forbidden("Only the team's managers and administrators may manage its webhooks.")
    return team


def _check_patterns(events: list[str]) -> list[str]:
    bad = [p for p in events if not pattern_is_valid(p)]
    if bad or not events:
        raise ValidationFailed(
            "Unknown event types.",
            fields={"events": [f"Unknown: {', '.join(bad)}." if bad else "Choose at least one event type."]},
        )
    return sorted(set(events))


# The first key of the advisory lock that serializes creating a team's webhooks (the second is the team's id, 0 for
# the fleet-wide ones); any constant no other advisory lock of the portal uses.
_ENDPOINTS_LOCK = 0x57_48_4B  # "WHK"


def webhook_create(*, user: User, team_slug: str | None, url: str, events: list[str]) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it and its `whsec_` secret, which is never shown again."""
    team = _manageable_team(user=user, team_slug=team_slug)
    patterns = _check_patterns(events)
    try:
        check_url(url)
    except UnsafeUrl as exc:
        raise ValidationFailed(str(exc), fields={"url": [str(exc)]}) from exc
    secret = secrets.new_secret()
    with transaction.atomic():
        # One lock per team (and one for the fleet-wide endpoints) makes the count and the insert one step:
        # parallel requests cannot pass the cap.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_ENDPOINTS_LOCK, team.pk if team else 0])
        held = WebhookEndpoint.objects.filter(team=team).count()
        if held >= settings.WEBHOOK_MAX_ENDPOINTS_PER_TEAM:
            whose = f"Team {team.slug}" if team else "The fleet"
            raise Conflict(
                f"{whose} has {held} webhooks, the most allowed: delete one it no longer uses.",
                code="too_many_webhooks",
            )
        endpoint = WebhookEndpoint.objects.create(
            team=team, url=url, events=patterns, secret_encrypted=secrets.encrypt(secret), created_by=user
        )
        audit_record(actor=user, action="webhook.created", target=endpoint, data={"url": url, "events": patterns})
    return endpoint, secret


def _endpoint_for(*, user: User, endpoint_id: int) -> WebhookEndpoint:
    endpoint = webhook_get(user=user, endpoint_id=endpoint_id)
    if endpoint is None:
        raise NotFound("No such webhook.")
    return endpoint


def webhook_delete(*, user: User, endpoint_id: int) -> None:
    endpoint = _endpoint_for(user=user, endpoint_id=endpoint_id)
    with transaction.atomic():
        audit_record(actor=user, action="webhook.deleted", target=endpoint, data={"url": endpoint.url})
        endpoint.delete()


def webhook_rotate_secret(*, user: User, endpoint_id: int) -> tuple[WebhookEndpoint, str]:
    """A new secret replaces the old at once (the next attempt is signed with it); shown once, like the first.
    Rotating also re-enables an endpoint that was disabled for failing, with its failure clock reset."""
    endpoint = _endpoint_for(user=user, endpoint_id=endpoint_id)
    secret = secrets.new_secret()
    with transaction.atomic():
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
            secret_encrypted=secrets.encrypt(secret),
            is_active=True,
            disabled_at=None,
            disabled_reason="",
            failing_since=None,
        )
        audit_record(actor=user, action="webhook.secret_rotated", target=endpoint)
    endpoint.refresh_from_db()
    return endpoint, secret


MAIL_FIELDS = ("job_finished", "job_failed", "reservation_starting", "idle_warnings", "budget_thresholds")


def mail_preference_update(*, user: User, changes: dict[str, bool]) -> MailPreference:
    """Set some of the user's mail preferences (unknown names are refused)."""
    unknown = sorted(set(changes) - set(MAIL_FIELDS))
    if unknown:
        raise ValidationFailed("Unknown preferences.", fields={name: ["Unknown preference."] for name in unknown})
    preference, _ = MailPreference.objects.get_or_create(user=user)
    for name, value in changes.items():
        setattr(preference, name, bool(value))
    preference.save()
    return preference
