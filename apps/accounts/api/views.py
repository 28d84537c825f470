from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import selectors, services
from apps.accounts.api.serializers import (
    MeOutput,
    TeamDetailOutput,
    TeamOutput,
    TokenCreatedOutput,
    TokenInput,
    TokenOutput,
)
from apps.accounts.models import ApiToken, Scope, Team
from apps.accounts.types import signed_in
from apps.core.api.base import PortalAPIView, ScopedListAPIView, ScopedRetrieveAPIView
from apps.core.idempotency import idempotent


class MeView(PortalAPIView):
    """The signed-in user, their teams and roles."""

    @extend_schema(responses=MeOutput)
    def get(self, request: Request) -> Response:
        user = request.user
        token = request.auth if isinstance(request.auth, ApiToken) else None
        data = {
            "id": user.pk,
            "username": user.get_username(),
            "email": getattr(user, "email", ""),
            "is_staff": user.is_staff,
            "teams": [{"team": m.team, "role": m.role} for m in selectors.memberships_of(user=user)],
            "token_scopes": token.scopes if token else None,
        }
        return Response(MeOutput(data).data)


class TokenListCreateView(generics.ListAPIView[ApiToken]):
    """Your personal API tokens, newest first (revoked and expired ones until TOKEN_RETENTION_DAYS after they
    stopped). The token value is returned once, at creation."""

    # Minting a token is a read-scope action only for the browser; a token cannot mint itself more power
    # (services refuse `admin` for non-staff, and a token can only create tokens with scopes it holds).
    required_scopes = {"POST": Scope.READ}
    serializer_class = TokenOutput

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.tokens_of(user=self.request.user)

    @extend_schema(request=TokenInput, responses={201: TokenCreatedOutput})
    @idempotent
    def post(self, request: Request) -> Response:
        payload = TokenInput(data=request.data)
        payload.is_valid(raise_exception=True)
        scopes = payload.validated_data["scopes"]
        if isinstance(request.auth, ApiToken):
            from apps.core.errors import Forbidden

            missing = [s for s in scopes if not request.auth.has_scope(s)]
            if missing:
                raise Forbidden(
                    f"A token cannot create a token with scopes it lacks: {', '.join(missing)}.",
                    code="insufficient_scope",
                )
        token, plaintext = services.token_create(
            user=signed_in(request.user),
            name=payload.validated_data["name"],
            scopes=scopes,
            expires_days=payload.validated_data.get("expires_days"),
        )
        return Response(
            TokenCreatedOutput(token, context={"plaintext": plaintext}).data, status=status.HTTP_201_CREATED
        )


class TokenDetailView(PortalAPIView):
    required_scopes = {"DELETE": Scope.READ}

    @extend_schema(responses={204: None})
    def delete(self, request: Request, token_id: int) -> Response:
        services.token_revoke(user=signed_in(request.user), token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamListView(ScopedListAPIView):
    """Teams you belong to (admins: all)."""

    model = Team
    serializer_class = TeamOutput


class TeamDetailView(ScopedRetrieveAPIView):
    """One team: members, your role; quota and month-to-date usage once booking and billing exist."""

    model = Team
    serializer_class = TeamDetailOutput
    lookup_field = "slug"
