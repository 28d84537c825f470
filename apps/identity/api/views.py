"""Group → team mappings: administrators only (the `admin` scope for tokens)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope
from apps.core.api.base import PortalAPIView
from apps.identity import selectors, services
from apps.identity.api.serializers import GroupMappingInput, GroupMappingOutput


class GroupMappingListCreateView(PortalAPIView):
    """Directory groups mapped to a team and role; applied at each member's sign-in (OIDC or LDAP)."""

    required_scopes = {"GET": Scope.ADMIN, "POST": Scope.ADMIN}

    @extend_schema(responses=GroupMappingOutput(many=True))
    def get(self, request: Request) -> Response:
        return Response(GroupMappingOutput(selectors.group_mappings_list(), many=True).data)

    @extend_schema(request=GroupMappingInput, responses={201: GroupMappingOutput})
    def post(self, request: Request) -> Response:
        payload = GroupMappingInput(data=request.data)
        payload.is_valid(raise_exception=True)
        mapping = services.group_mapping_create(actor=request.user, **payload.validated_data)
        return Response(GroupMappingOutput(mapping).data, status=status.HTTP_201_CREATED)


class GroupMappingDetailView(PortalAPIView):
    required_scopes = {"DELETE": Scope.ADMIN}

    @extend_schema(responses={204: None})
    def delete(self, request: Request, mapping_id: int) -> Response:
        services.group_mapping_delete(actor=request.user, mapping_id=mapping_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
