from django.urls import path

from apps.booking import views

app_name = "booking"
urlpatterns = [
    path("", views.index, name="index"),
    path("calendar/regenerate/", views.calendar_regenerate, name="calendar-regenerate"),
    path("calendar/<str:key>.ics", views.calendar_feed, name="calendar-feed"),
]
