from django.urls import path

from apps.efficiency import views

app_name = "efficiency"
urlpatterns = [path("", views.index, name="index")]
