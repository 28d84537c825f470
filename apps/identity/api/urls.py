from django.urls import path

from apps.identity.api import views

urlpatterns = [
    path("group-mappings/", views.GroupMappingListCreateView.as_view(), name="api-group-mappings"),
    path("group-mappings/<int:mapping_id>/", views.GroupMappingDetailView.as_view(), name="api-group-mapping-detail"),
    path("unix-accounts/", views.UnixAccountListLoadView.as_view(), name="api-unix-accounts"),
]
