from django.urls import path

from apps.accounts.api import views

urlpatterns = [
    path("me", views.MeView.as_view(), name="api-me"),
    path("tokens/", views.TokenListCreateView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>/", views.TokenDetailView.as_view(), name="api-token-detail"),
    path("teams/", views.TeamListView.as_view(), name="api-teams"),
    path("teams/<slug:slug>/", views.TeamDetailView.as_view(), name="api-team-detail"),
]
