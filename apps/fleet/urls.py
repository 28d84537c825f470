from django.urls import path

from apps.core import urlconverters  # noqa: F401  # registers <segment:...>
from apps.fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.fleet_page, name="index"),
    path("gpus/<segment:uuid>/", views.gpu_page, name="gpu"),
    path("nodes/<segment:name>/drain/", views.node_drain, {"draining": True}, name="node-drain"),
    path("nodes/<segment:name>/undrain/", views.node_drain, {"draining": False}, name="node-undrain"),
]
