"""/metrics: Prometheus text (apps.telemetry.metrics). Open by default, like dcgm-exporter; with METRICS_TOKEN set
it wants `Authorization: Bearer <METRICS_TOKEN>`."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from apps.telemetry.metrics import render

# The text format render() writes (prometheus-client's newest default is 1.0.0; Prometheus reads both).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    expected = settings.METRICS_TOKEN
    if expected:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            return HttpResponse(
                "unauthenticated\n", status=401, content_type=CONTENT_TYPE, headers={"WWW-Authenticate": "Bearer"}
            )
    return HttpResponse(render(), content_type=CONTENT_TYPE)
