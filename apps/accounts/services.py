"""Writes for accounts: teams, memberships, tokens."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts import tokens
from apps.accounts.models import ApiToken, Membership, MembershipSource, Role, Scope, Team
from apps.accounts.types import AnyUser, User
from apps.audit.services import audit_record
from apps.core.errors import Conflict, Forbidden, NotFound, ValidationFailed

VALID_SCOPES = {choice.value for choice in Scope}


def token_create(*, user: User, name: str, scopes: list[str], expires_days: int | None = 90) -> tuple[ApiToken, str]:
    """Create a personal token; returns (row, plaintext). The plaintext is never stored or shown again."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValidationFailed("Give the token a name of 1-100 characters.", fields={"name": ["1-100 characters."]})
    if not scopes:
        raise ValidationFailed("Choose at least one scope.", fields={"scopes": ["At least one scope."]})
    unknown = sorted(set(scopes) - VALID_SCOPES)
    if unknown:
        raise ValidationFailed(
            f"Unknown scope(s): {', '.join(unknown)}.",
            fields={"scopes": [f"Valid scopes: {', '.join(sorted(VALID_SCOPES))}."]},
        )
    if Scope.ADMIN in scopes and not user.is_staff:
        raise Forbidden("Only administrators may create tokens with the 'admin' scope.")
    expires_at = None
    if expires_days is not None:
        if not 1 <= expires_days <= settings.TOKEN_MAX_EXPIRY_DAYS:
            raise ValidationFailed(
                f"expires_days must be between 1 and {settings.TOKEN_MAX_EXPIRY_DAYS}.",
                fields={"expires_days": [f"1-{settings.TOKEN_MAX_EXPIRY_DAYS}."]},
            )
        expires_at = timezone.now() + timedelta(days=expires_days)
    plaintext, prefix, digest = tokens.generate()
    with transaction.atomic():
        # The user's row lock makes the count and the insert one step: parallel requests cannot pass the cap.
        User.objects.select_for_update().filter(pk=user.pk).first()
        now = timezone.now()
        active = (
            ApiToken.objects.filter(user=user, revoked_at__isnull=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
            .count()
        )
        if active >= settings.TOKEN_MAX_ACTIVE_PER_USER:
            raise Conflict(
                f"You have {active} active tokens, the most one account may hold: revoke one you no longer use.",
                code="too_many_tokens",
            )
        token = ApiToken.objects.create(
            user=user, name=name, prefix=prefix, digest=digest, scopes=sorted(set(scopes)), expires_at=expires_at
        )
        audit_record(actor=user, action="token.create", target=token, data={"scopes": token.scopes})
    return token, plaintext


def token_revoke(*, user: User, token_id: int) -> ApiToken:
    """Revoke one of the user's own tokens (admins may revoke anyone's)."""
    with transaction.atomic():
        qs = ApiToken.objects.select_for_update()
        if not user.is_staff:
            qs = qs.filter(user=user)
        token = qs.filter(pk=token_id).first()
        if token is None:
            raise NotFound("No such token.")
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(actor=user, action="token.revoke", target=token)
    return token


def tokens_prune(*, now: datetime | None = None, batch: int = 1000) -> int:
    """Delete tokens revoked or expired more than TOKEN_RETENTION_DAYS ago, `batch` rows per statement.

    A token past that point can never authenticate again, and without a bound a script that mints a token per run
    grows the list (and the settings page) without end. Nothing references a token row; the audit log keeps its own
    record of each creation and revocation."""
    days = settings.TOKEN_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    stale = ApiToken.objects.filter(Q(revoked_at__lt=cutoff) | Q(expires_at__lt=cutoff))
    deleted = 0
    while ids := list(stale.values_list("pk", flat=True)[:batch]):
        deleted += ApiToken.objects.filter(pk__in=ids).delete()[0]
    return deleted


def team_create(*, actor: AnyUser | None, slug: str, name: str, share: int = 1) -> Team:
    with transaction.atomic():
        team = Team.objects.create(slug=slug, name=name, share=share)
        audit_record(actor=actor, action="team.create", target=team)
    return team


def membership_set(*, actor: AnyUser | None, team: Team, user: User, role: str = Role.MEMBER) -> Membership:
    """Add a user to a team or change their role (idempotent). A membership set by hand is manual: a directory sync
    leaves it alone unless a group mapping takes manual memberships over."""
    if role not in Role.values:
        raise ValidationFailed(f"Unknown role {role!r}.")
    with transaction.atomic():
        membership, created = Membership.objects.update_or_create(
            user=user, team=team, defaults={"role": role, "source": MembershipSource.MANUAL}
        )
        audit_record(actor=actor, action="membership.set", target=membership, data={"role": role, "created": created})
    return membership


def user_get_or_create(*, username: str, password: str, email: str = "", is_staff: bool = False) -> User:
    user, created = User.objects.get_or_create(
        username=username, defaults={"email": email, "is_staff": is_staff, "is_superuser": is_staff}
    )
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    return user
