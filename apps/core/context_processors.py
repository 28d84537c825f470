from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def portal(request: HttpRequest) -> dict[str, Any]:
    """Name, currency and navigation state for the base layout."""
    return {
        "PORTAL_NAME": settings.PORTAL_NAME,
        "PORTAL_CURRENCY": settings.PORTAL_CURRENCY,
        "nav_section": request.resolver_match.namespace if request.resolver_match else "",
    }
