"""Scopes: a token may only do what its scopes allow; a signed-in browser session has every scope its
user's role gives. Views declare `write_scope` (the scope for unsafe methods); reads need `read`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from apps.accounts.models import ApiToken, Scope

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView


class InsufficientScope(exceptions.PermissionDenied):
    default_code = "insufficient_scope"


def required_scope(request: Request, view: APIView) -> str:
    per_method: dict[str, str] = getattr(view, "required_scopes", {})
    if request.method in per_method:
        return per_method[request.method]
    if request.method in SAFE_METHODS:
        return Scope.READ
    # An unsafe method on a view that forgot to declare its scope is admin-only, not open.
    return getattr(view, "write_scope", Scope.ADMIN)


class TokenScopePermission(BasePermission):
    """Authenticated, and, for token requests, holding the scope the view and method need."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not user.is_authenticated:
            raise exceptions.NotAuthenticated()
        scope = required_scope(request, view)
        token = request.auth
        if isinstance(token, ApiToken) and not token.has_scope(scope):
            raise InsufficientScope(f"This token lacks the '{scope}' scope.", code="insufficient_scope")
        if scope == Scope.ADMIN and not user.is_staff:
            raise exceptions.PermissionDenied("Only administrators may do this.")
        return True


class IsStaff(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and request.user.is_staff)
