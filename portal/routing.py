"""Websocket routes. Each app that streams adds its consumers here (see DESIGN.md for the paths)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

websocket_urlpatterns: list[URLPattern | URLResolver] = []
