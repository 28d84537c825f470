"""URL configuration: pages, REST API v1, OpenAPI, admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.core import views as core_views
from apps.telemetry import views as telemetry_views

# The busiest endpoints first: Django tries the includes in order, and each one that does not match raises and
# catches a Resolver404 before the next is tried.
api_v1: list[URLPattern | URLResolver] = [
    path("", include("apps.jobs.api.urls")),
    path("", include("apps.booking.api.urls")),
    path("", include("apps.fleet.api.urls")),
    path("", include("apps.accounts.api.urls")),
    path("", include("apps.core.api.urls")),
    path("", include("apps.billing.api.urls")),
    path("", include("apps.identity.api.urls")),
    path("", include("apps.events.api.urls")),
    path("", include("apps.efficiency.api.urls")),
    path("", include("apps.pools.api.urls")),
    # Last: a JSON 404 for every other API path.
    re_path(r"^(?P<rest>.*)$", core_views.api_unknown_path, name="api-unknown-path"),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("", core_views.home, name="home"),
    path("favicon.ico", core_views.favicon, name="favicon"),
    path("accounts/", include("apps.accounts.urls")),
    path("accounts/oidc/", include("apps.identity.urls")),
    path("fleet/", include("apps.fleet.urls")),
    path("book/", include("apps.booking.urls")),
    path("jobs/", include("apps.jobs.urls")),
    path("costs/", include("apps.billing.urls")),
    path("efficiency/", include("apps.efficiency.urls")),
    path("events/", include("apps.events.urls")),
    path("admin/", admin.site.urls),
    path("metrics", telemetry_views.metrics, name="metrics"),
    path("metrics/targets", telemetry_views.metrics_targets, name="metrics-targets"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file of its own: the Content-Security-Policy allows no inline one.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]

handler400 = "apps.core.views.bad_request"
handler403 = "apps.core.views.permission_denied"
handler404 = "apps.core.views.not_found"
handler500 = "apps.core.views.server_error"
