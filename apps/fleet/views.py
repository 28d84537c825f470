"""Fleet pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.fleet import selectors


@login_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/fleet.html", {"nodes": selectors.nodes_visible_to(user=request.user)})
