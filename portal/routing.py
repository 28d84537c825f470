"""Websocket routes. Each app that streams adds its consumers here (docs/api.md lists the paths)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from apps.billing.consumers import TeamCostConsumer
from apps.booking.consumers import BookingsConsumer
from apps.core.consumers import NoStreamConsumer
from apps.jobs.consumers import JobConsumer, JobListConsumer
from apps.telemetry.consumers import FleetConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
    path("ws/jobs/", JobListConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
    path("ws/teams/<slug:slug>/", TeamCostConsumer.as_asgi()),
    path("ws/bookings/", BookingsConsumer.as_asgi()),
    re_path(r"", NoStreamConsumer.as_asgi()),  # last: any other path closes with 4404
]
