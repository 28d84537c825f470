"""Turn a database outage into 503 with the error shape (API) or a plain page (browser), never a traceback; refuse
a query string that holds a NUL character before any view reads it; send the Content-Security-Policy."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
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
        if _wants_json(request):
            response: HttpResponse = JsonResponse(
                {"code": "unavailable", "detail": "The database is unavailable; retry shortly.", "fields": {}},
                status=503,
            )
        else:
            response = SimpleTemplateResponse("core/unavailable.html", status=503)
            response.render()
        response["Retry-After"] = "5"
        return response


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith("/api/") or request.path == "/metrics"


class NulQueryStringMiddleware:
    """400 for a query string with a percent-encoded NUL (`%00`). PostgreSQL's text types cannot hold NUL, so a
    value with one that reaches a lookup is a DataError (500) wherever a view forgot to check; no parameter of
    the portal has a use for it, so it is refused here, once, for every route (the admin's search included)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "%00" not in request.META.get("QUERY_STRING", ""):
            return self.get_response(request)
        detail = "The query string holds a NUL character."
        if _wants_json(request):
            return JsonResponse({"code": "malformed_request", "detail": detail, "fields": {}}, status=400)
        return HttpResponseBadRequest(detail, content_type="text/plain; charset=utf-8")


class ContentSecurityPolicyMiddleware:
    """`Content-Security-Policy` on every response (CONTENT_SECURITY_POLICY; empty: none), unless a view set its own:
    scripts and styles only from this server (no inline scripts, handlers, `<style>` blocks or style attributes: the
    templates ask for behaviour by attribute, and scripts set styles through the CSSOM, which the policy allows), no
    plugins, no framing. Pages the portal does not write (Django admin, the Swagger page: CSP_INLINE_STYLE_PATHS) use
    inline styles, so under those paths `style-src` also allows them; their scripts stay refused."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy: str = settings.CONTENT_SECURITY_POLICY
        self.inline_style_paths: tuple[str, ...] = tuple(settings.CSP_INLINE_STYLE_PATHS)
        self.inline_style_policy = with_inline_styles(self.policy)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            inline = self.inline_style_paths and request.path.startswith(self.inline_style_paths)
            response["Content-Security-Policy"] = self.inline_style_policy if inline else self.policy
        return response


def with_inline_styles(policy: str) -> str:
    """The policy with `'unsafe-inline'` added to `style-src` (made from `default-src` where it has none)."""
    directives = [d.strip() for d in policy.split(";") if d.strip()]
    names = [d.split()[0].lower() for d in directives]
    if "style-src" not in names:
        default = next((d.split()[1:] for d in directives if d.split()[0].lower() == "default-src"), ["'self'"])
        directives.append(" ".join(["style-src", *default]))
        names.append("style-src")
    i = names.index("style-src")
    if "'unsafe-inline'" not in directives[i].split():
        directives[i] += " 'unsafe-inline'"
    return "; ".join(directives)
