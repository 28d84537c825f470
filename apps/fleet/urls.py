from django.urls import path

from apps.fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.fleet_page, name="index"),
    path("gpus/<str:uuid>/", views.gpu_page, name="gpu"),
    path("nodes/<str:name>/drain/", views.node_drain, {"draining": True}, name="node-drain"),
    path("nodes/<str:name>/undrain/", views.node_drain, {"draining": False}, name="node-undrain"),
]
