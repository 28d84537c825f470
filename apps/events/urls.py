from django.urls import path

from apps.events import views

app_name = "events"
urlpatterns = [
    path("webhooks/", views.webhooks, name="webhooks"),
    path("webhooks/<int:endpoint_id>/", views.webhook_detail, name="webhook-detail"),
    path("webhooks/<int:endpoint_id>/rotate-secret/", views.webhook_rotate, name="webhook-rotate"),
    path("webhooks/<int:endpoint_id>/delete/", views.webhook_delete, name="webhook-delete"),
    path("notifications/", views.notifications, name="notifications"),
]
