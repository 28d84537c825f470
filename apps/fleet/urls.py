from django.urls import path

from apps.fleet import views

app_name = "fleet"
urlpatterns = [path("", views.fleet_page, name="index")]
