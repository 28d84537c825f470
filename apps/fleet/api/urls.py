from django.urls import path

from apps.core import urlconverters  # noqa: F401  # registers <segment:...>
from apps.fleet.api import views

urlpatterns = [
    path("gpu-models/", views.GpuModelListView.as_view(), name="api-gpu-models"),
    path("nodes/", views.NodeListView.as_view(), name="api-nodes"),
    path("nodes/<segment:name>/drain/", views.NodeDrainView.as_view(), name="api-node-drain"),
    path("nodes/<segment:name>/undrain/", views.NodeUndrainView.as_view(), name="api-node-undrain"),
    path("gpus/", views.GpuListView.as_view(), name="api-gpus"),
    path("gpus/<segment:uuid>/history/", views.GpuHistoryView.as_view(), name="api-gpu-history"),
    path("gpus/<segment:uuid>/probe/", views.GpuProbeView.as_view(), name="api-gpu-probe"),
]
