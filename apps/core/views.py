"""Home page and error pages (JSON in the error shape under /api/, HTML elsewhere)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt

from apps.core import selectors


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "core/home.html", {"summary": selectors.home_summary(user=request.user)})


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on pages without a <link rel="icon"> (API docs, PDFs, JSON)."""
    return HttpResponsePermanentRedirect(static("core/favicon.svg"))


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's own 400s (a Host not in ALLOWED_HOSTS, other suspicious requests) never reach DRF."""
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "bad_request", "detail": "Bad request.", "fields": {}}, status=400)
    return HttpResponse("Bad request.", status=400, content_type="text/plain")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "forbidden", "detail": "Forbidden.", "fields": {}}, status=403)
    return HttpResponse("Forbidden.", status=403, content_type="text/plain")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": "Not found.", "fields": {}}, status=404)
    return render(request, "core/404.html", status=404)


@csrf_exempt  # it changes nothing, and a CSRF refusal would be Django's HTML page, not the error shape
def api_unknown_path(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any /api/v1/ path no endpoint has: the JSON error shape whatever DEBUG says (Django's own 404 is an HTML
    page under DEBUG, as the embedded default runs). A path missing its trailing slash is redirected for GET and
    HEAD, as Django's APPEND_SLASH would, and answered with where to send it otherwise: a redirected POST arrives
    as a GET, and under DEBUG Django refuses it with a 500."""
    slashed = request.path + "/"
    if not request.path.endswith("/") and _has_endpoint(slashed):
        if request.method in ("GET", "HEAD"):
            query = request.META.get("QUERY_STRING", "")
            return HttpResponsePermanentRedirect(slashed + (f"?{query}" if query else ""))
        detail = f"Not found: API paths end with a slash ({slashed})."
        return JsonResponse({"code": "not_found", "detail": detail, "fields": {}}, status=404)
    return JsonResponse({"code": "not_found", "detail": "Not found.", "fields": {}}, status=404)


def _has_endpoint(path: str) -> bool:
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return match.func is not api_unknown_path


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"code": "server_error", "detail": "Internal error; it has been logged.", "fields": {}}, status=500
        )
    return render(request, "core/500.html", status=500)
