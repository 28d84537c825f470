"""The one place that decides which rows a user may see.

Every team-owned model's queryset subclasses `ScopedQuerySet` and names the path from the model to its team
(`team_path`). Every API view and websocket consumer gets its rows through `visible_to(user)`; the permission
matrix test checks each endpoint against an outsider. Staff (admins) see everything.

Team ids come through the user's `memberships` relation, so this module needs no model of its own app: the
models import it for their querysets.
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from django.db import models

from apps.accounts.choices import Role
from apps.accounts.types import AnyUser

_M = TypeVar("_M", bound=models.Model)
# Where team_ids_of keeps its answer on the user object: it lives as long as the request's user does.
_TEAM_IDS_ATTR = "_portal_team_ids"


def team_ids_of(user: AnyUser) -> list[int]:
    """Ids of the teams the user belongs to, cached on the user object for the request."""
    if not user.is_authenticated:
        return []
    cached: list[int] | None = getattr(user, _TEAM_IDS_ATTR, None)
    if cached is None:
        cached = list(user.memberships.values_list("team_id", flat=True))
        setattr(user, _TEAM_IDS_ATTR, cached)
    return list(cached)


def managed_team_ids_of(user: AnyUser) -> list[int]:
    if not user.is_authenticated:
        return []
    return list(user.memberships.filter(role=Role.MANAGER).values_list("team_id", flat=True))


class ScopedQuerySet(models.QuerySet[_M], Generic[_M]):
    """Subclasses set `team_path`: the lookup from the model to its team's pk ("team", "job__team", "pk").

    `team_path = None` means the rows are not team-owned and every signed-in user may see them
    (GPU models, images); anonymous users never see anything.
    """

    team_path: ClassVar[str | None] = "team"

    def _team_lookup(self) -> str:
        assert self.team_path is not None
        return self.team_path if self.team_path == "pk" or self.team_path.endswith("_id") else f"{self.team_path}_id"

    def visible_to(self, user: AnyUser) -> ScopedQuerySet[_M]:
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_staff or self.team_path is None:
            return self
        return self.filter(**{f"{self._team_lookup()}__in": team_ids_of(user)})

    def managed_by(self, user: AnyUser) -> ScopedQuerySet[_M]:
        """Rows of teams the user manages (managers change team settings; admins manage everything)."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_staff:
            return self
        if self.team_path is None:
            return self.none()
        return self.filter(**{f"{self._team_lookup()}__in": managed_team_ids_of(user)})
