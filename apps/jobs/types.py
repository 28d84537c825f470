"""Type names shared by the jobs app's signatures."""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as _AuthUser

from apps.core.errors import Forbidden

# The portal's user model (AUTH_USER_MODEL is Django's own): who submits, cancels and owns jobs.
User: TypeAlias = _AuthUser
# Whom a read is for: a request's user, signed in or not (scoping answers the anonymous with nothing).
Viewer: TypeAlias = _AuthUser | AnonymousUser


def signed_in(user: Viewer) -> User:
    """The request's user for a write. Views that write require authentication first, so an anonymous user here
    is a view's mistake: refused, never treated as someone."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise Forbidden("Sign in first.")
    return user
