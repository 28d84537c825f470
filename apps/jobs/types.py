"""Type names shared by the jobs app's signatures."""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import User as _AuthUser

# The portal's user model (AUTH_USER_MODEL is Django's own): what services and selectors take as `user`.
User: TypeAlias = _AuthUser
