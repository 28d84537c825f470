"""A request's user narrowed for the jobs app's writes (the type names themselves live in apps.accounts.types)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser

from apps.accounts.types import AnyUser, User
from apps.core.errors import Forbidden


def signed_in(user: AnyUser) -> User:
    """The request's user for a write. Views that write require authentication first, so an anonymous user here
    is a view's mistake: refused, never treated as someone."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise Forbidden("Sign in first.")
    return user
