"""Type names for the portal's users, shared by every app's signatures."""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as _AuthUser

# The portal's user model (AUTH_USER_MODEL is Django's own): what services and selectors take as `user`.
User: TypeAlias = _AuthUser
# Whoever made a request, signed in or not (`request.user`): what read paths that scope by user accept.
AnyUser: TypeAlias = _AuthUser | AnonymousUser


def signed_in(user: AnyUser) -> User:
    """The request's user for a write. Views that write require authentication first, so an anonymous user here
    is a view's mistake: refused, never treated as someone."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        from apps.core.errors import Forbidden

        raise Forbidden("Sign in first.")
    return user
