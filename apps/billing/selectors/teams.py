"""Which teams a user sees on the Costs pages, and their notifications."""

from __future__ import annotations

from apps.accounts.models import Role, Team
from apps.accounts.scoping import team_ids_of
from apps.accounts.types import AnyUser, User
from apps.billing.models import Notification
from apps.core.errors import NotFound


def notifications_for(*, user: AnyUser, team: Team | None = None, limit: int = 10) -> list[Notification]:
    """Recent notifications of the user's teams (admins: all teams), newest first."""
    qs = Notification.objects.visible_to(user).select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    return list(qs[:limit])


def team_page_visible(*, user: AnyUser, slug: str) -> Team:
    """The team, if the user may see its cost page (members, managers, admins); 404 otherwise."""
    team = Team.objects.visible_to(user).filter(slug=slug).first()
    if team is None:
        raise NotFound("No such team.")
    return team


def is_manager_of(*, user: AnyUser, team: Team) -> bool:
    if user.is_staff:
        return True
    if not isinstance(user, User):
        return False
    return team.memberships.filter(user=user, role=Role.MANAGER).exists()


def teams_of_user(*, user: AnyUser) -> list[Team]:
    return list(Team.objects.filter(pk__in=team_ids_of(user)).order_by("slug"))
