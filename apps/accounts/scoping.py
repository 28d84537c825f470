"""The one place that decides which rows a user may see.

Every team-owned model's queryset subclasses `ScopedQuerySet` and names the path from the model to its team
(`team_path`). Every API view and websocket consumer gets its rows through `visible_to(user)`; the permission
matrix test checks each endpoint against an outsider. Staff (admins) see everything.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from django.db import models

_M = TypeVar("_M", bound=models.Model)


def team_ids_of(user: Any) -> list[int]:
    """Ids of the teams the user belongs to, cached on the user object for the request."""
    if not getattr(user, "is_authenticated", False):
        return []
    cached = getattr(user, "_portal_team_ids", None)
    if cached is None:
        from apps.accounts.models import Membership

        cached = list(Membership.objects.filter(user=user).values_list("team_id", flat=True))
        user._portal_team_ids = cached
    return list(cached)


def managed_team_ids_of(user: Any) -> list[int]:
    if not getattr(user, "is_authenticated", False):
        return []
    from apps.accounts.models import Membership, Role

    return list(Membership.objects.filter(user=user, role=Role.MANAGER).values_list("team_id", flat=True))


class ScopedQuerySet(models.QuerySet[_M], Generic[_M]):
    """Subclasses set `team_path`: the lookup from the model to its team's pk ("team", "job__team", "pk").

    `team_path = None` means the rows are not team-owned and every signed-in user may see them
    (GPU models, images); anonymous users never see anything.
    """

    team_path: ClassVar[str | None] = "team"

    def _team_lookup(self) -> str:
        assert self.team_path is not None
        return self.team_path if self.team_path == "pk" or self.team_path.endswith("_id") else f"{self.team_path}_id"

    def visible_to(self, user: Any) -> ScopedQuerySet[_M]:
        if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
            return self.none()
        if user.is_staff or self.team_path is None:
            return self
        return self.filter(**{f"{self._team_lookup()}__in": team_ids_of(user)})

    def managed_by(self, user: Any) -> ScopedQuerySet[_M]:
        """Rows of teams the user manages (managers change team settings; admins manage everything)."""
        if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
            return self.none()
        if user.is_staff:
            return self
        if self.team_path is None:
            return self.none()
        return self.filter(**{f"{self._team_lookup()}__in": managed_team_ids_of(user)})
