from django.urls import path

from apps.fleet.api import views

urlpatterns = [
    path("gpu-models/", views.GpuModelListView.as_view(), name="api-gpu-models"),
]
