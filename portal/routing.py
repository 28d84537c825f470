"""Websocket routes. Each app that streams adds its consumers here (docs/api.md lists the paths)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from apps.billing.consumers import TeamCostConsumer
from apps.jobs.consumers import JobConsumer
from apps.telemetry.consumers import FleetConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
    path("ws/teams/<slug:slug>/", TeamCostConsumer.as_asgi()),
]
