"""Group → team mappings and users' POSIX uids: administrators only (the `admin` scope for tokens)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope
from apps.core.api.base import PortalAPIView
from apps.identity import selectors, services
from apps.identity.api.serializers import (
    GroupMappingInput,
    GroupMappingOutput,
    UnixAccountOutput,
    UnixAccountsLoadInput,
    UnixAccountsLoadOutput,
)


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


class UnixAccountListLoadView(PortalAPIView):
    """Which POSIX uid each portal user's processes run as on the GPU nodes: how a node's GPU processes are told
    apart by holder (docs/identity.md). Set at sign-in from LDAP or OIDC where configured; here in bulk otherwise."""

    required_scopes = {"GET": Scope.ADMIN, "POST": Scope.ADMIN}

    @extend_schema(responses=UnixAccountOutput(many=True))
    def get(self, request: Request) -> Response:
        return Response(UnixAccountOutput(selectors.unix_accounts_list(), many=True).data)

    @extend_schema(request=UnixAccountsLoadInput, responses=UnixAccountsLoadOutput)
    def post(self, request: Request) -> Response:
        payload = UnixAccountsLoadInput(data=request.data)
        payload.is_valid(raise_exception=True)
        entries = [(e["user"], e["uid"]) for e in payload.validated_data["accounts"]]
        changed, skipped = services.unix_uids_load(
            actor=request.user, entries=entries, skip_unknown=payload.validated_data["skip_unknown_users"]
        )
        accounts = selectors.unix_accounts_list(usernames=[name for name, _ in entries])
        out = {"changed": changed, "skipped": skipped, "accounts": UnixAccountOutput(accounts, many=True).data}
        return Response(out)
