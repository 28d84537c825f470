"""Content negotiation with a shortcut for what API clients send (no Accept header, */* or application/json)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer

# Accept headers answered without parsing: what requests, curl, the CLI, browsers' fetch() and CI tools send.
_ANY = frozenset({"*/*"})
_JSON = frozenset({"application/json"})


class ContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, except that the common Accept headers skip the parse.

    Why: DRF parses the Accept header and every renderer's media type on each request (~0.25 ms of the web
    process's CPU per job submission under load). For no header, `*/*` or exactly the first renderer's type the
    answer is always the first renderer with its own media type, which is what DRF returns for them too
    (`tests/core/test_negotiation.py` compares the two); anything else goes through DRF.
    """

    def select_renderer(self, request: Any, renderers: Iterable[BaseRenderer], format_suffix: str | None = None) -> Any:
        choices = list(renderers)  # DRF passes a list; a copy keeps an iterator whole for the fallback
        if choices and not format_suffix and self.settings.URL_FORMAT_OVERRIDE not in request.query_params:
            accept = request.META.get("HTTP_ACCEPT", "*/*")
            first = choices[0]
            if accept in _ANY or (accept in _JSON and first.media_type == accept):
                return first, first.media_type
        return super().select_renderer(request, choices, format_suffix)
