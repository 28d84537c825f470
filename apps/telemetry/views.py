"""/metrics: Prometheus text (apps.telemetry.metrics), and /metrics/targets: the same series as one Prometheus
target per node (HTTP service discovery). Open by default, like dcgm-exporter; with METRICS_TOKEN set both want
`Authorization: Bearer <METRICS_TOKEN>`. docs/monitoring.md shows the scrape configurations."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from apps.fleet.models import Node
from apps.telemetry.metrics import render, render_portal

# The text format render() writes (prometheus-client's newest default is 1.0.0; Prometheus reads both).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
SCOPES = ("all", "portal")


def _unauthenticated(request: HttpRequest) -> HttpResponse | None:
    expected = settings.METRICS_TOKEN
    if not expected:
        return None
    given = request.headers.get("Authorization", "")
    if hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
        return None
    return HttpResponse(
        "unauthenticated\n", status=401, content_type=CONTENT_TYPE, headers={"WWW-Authenticate": "Bearer"}
    )


def _error(status: int, code: str, detail: str, field: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail, "fields": {field: [detail]}}, status=status)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Everything; `?node=<name>`: that node's GPU series alone; `?scope=portal`: the portal's own families alone."""
    if (refused := _unauthenticated(request)) is not None:
        return refused
    node = request.GET.get("node")
    scope = request.GET.get("scope", "all")
    if scope not in SCOPES:
        return _error(400, "invalid", f"scope must be one of {', '.join(SCOPES)}", "scope")
    if node is not None:
        if not Node.objects.filter(name=node[:255]).exists():
            return _error(404, "not_found", "no node of that name", "node")
        return HttpResponse(render(node=node), content_type=CONTENT_TYPE)
    if scope == "portal":
        return HttpResponse(render_portal(), content_type=CONTENT_TYPE)
    return HttpResponse(render(), content_type=CONTENT_TYPE)


@require_GET
def metrics_targets(request: HttpRequest) -> HttpResponse:
    """Prometheus HTTP service discovery: one target per node (its GPU series, `instance` = the node) and one for
    the portal's own families, all at the address the scraper reached this portal by."""
    if (refused := _unauthenticated(request)) is not None:
        return refused
    address = request.get_host()
    common = {"__scheme__": request.scheme or "http", "__metrics_path__": "/metrics"}
    groups: list[dict[str, object]] = [
        {"targets": [address], "labels": {**common, "__param_node": name, "instance": name}}
        for name in Node.objects.order_by("name").values_list("name", flat=True)
    ]
    groups.append({"targets": [address], "labels": {**common, "__param_scope": "portal"}})
    return JsonResponse(groups, safe=False)
