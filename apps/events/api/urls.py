from django.urls import path

from apps.events.api import views

urlpatterns = [
    path("webhooks/", views.WebhookListCreateView.as_view(), name="api-webhooks"),
    path("webhooks/<int:endpoint_id>/", views.WebhookDetailView.as_view(), name="api-webhook-detail"),
    path(
        "webhooks/<int:endpoint_id>/rotate-secret/",
        views.WebhookRotateSecretView.as_view(),
        name="api-webhook-rotate-secret",
    ),
    path(
        "webhooks/<int:endpoint_id>/deliveries/", views.WebhookDeliveriesView.as_view(), name="api-webhook-deliveries"
    ),
    path("me/notifications/", views.MailPreferenceView.as_view(), name="api-mail-preferences"),
]
