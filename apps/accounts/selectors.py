"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import ApiToken, Membership, Team
from apps.accounts.types import AnyUser, User


def teams_of(*, user: AnyUser) -> QuerySet[Team]:
    """Teams the user belongs to (admins: all teams)."""
    return Team.objects.visible_to(user).order_by("slug")


def memberships_of(*, user: AnyUser) -> QuerySet[Membership]:
    if not isinstance(user, User):
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("team").order_by("team__slug")


def role_in(*, user: User, team: Team) -> str | None:
    membership = Membership.objects.filter(user=user, team=team).first()
    return membership.role if membership else None


def tokens_of(*, user: AnyUser) -> QuerySet[ApiToken]:
    if not isinstance(user, User):
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user).order_by("-created_at")


def team_members(*, team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")
