"""Turn a database outage into 503 with the error shape (API) or a plain page (browser), never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import SimpleTemplateResponse

logger = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unavailable while serving %s: %s", request.path, exception.__class__.__name__)
        if request.path.startswith("/api/") or request.path == "/metrics":
            response: HttpResponse = JsonResponse(
                {"code": "unavailable", "detail": "The database is unavailable; retry shortly.", "fields": {}},
                status=503,
            )
        else:
            response = SimpleTemplateResponse("core/unavailable.html", status=503)
            response.render()
        response["Retry-After"] = "5"
        return response
