from django.urls import path

from apps.identity import views

app_name = "identity"
urlpatterns = [
    path("start/", views.OIDCStartView.as_view(), name="oidc-start"),
    path("callback/", views.OIDCCallbackView.as_view(), name="oidc-callback"),
]
