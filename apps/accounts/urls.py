from django.urls import path

from apps.accounts import views
from apps.identity.views import SignOutView

app_name = "accounts"
urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    # Ends the OIDC provider's session too for someone who signed in there (apps/identity).
    path("logout/", SignOutView.as_view(), name="logout"),
    path("settings/", views.settings_page, name="settings"),
    path("settings/tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]
