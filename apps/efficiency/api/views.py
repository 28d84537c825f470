"""Efficiency API: thin views over apps.efficiency.selectors and services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope, Team
from apps.core.api.base import PortalAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.efficiency import selectors, services
from apps.efficiency.api.serializers import IdlePolicyInput, IdlePolicyOutput


class IdlePolicyView(PortalAPIView):
    """A team's idle policy: its members and admins read it, admins change it (PATCH, partial)."""

    write_scope = Scope.ADMIN

    def _team(self, request: Request, slug: str) -> Team:
        team = Team.objects.visible_to(request.user).filter(slug=slug).first()
        if team is None:
            raise NotFound("No such team.")
        return team

    @extend_schema(responses={200: IdlePolicyOutput})
    def get(self, request: Request, slug: str) -> Response:
        return Response(IdlePolicyOutput(selectors.policy_of(self._team(request, slug))).data)

    @extend_schema(request=IdlePolicyInput, responses={200: IdlePolicyOutput})
    def patch(self, request: Request, slug: str) -> Response:
        team = self._team(request, slug)
        if not isinstance(request.data, dict):
            raise ValidationFailed("A JSON object is expected.")
        data: dict[str, Any] = dict(request.data)
        policy = services.idle_policy_update(user=request.user, team=team, data=data)
        return Response(IdlePolicyOutput(policy).data)
