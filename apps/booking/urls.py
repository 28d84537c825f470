from django.urls import path

from apps.booking import views
from apps.core import urlconverters  # noqa: F401  # registers <segment:...>

app_name = "booking"
urlpatterns = [
    path("", views.index, name="index"),
    path("reservations/<int:reservation_id>/", views.detail, name="detail"),
    path("reservations/<int:reservation_id>/end/", views.end, name="end"),
    path("reservations/<int:reservation_id>/change-end/", views.change_end, name="change-end"),
    path("calendar/regenerate/", views.calendar_regenerate, name="calendar-regenerate"),
    path("calendar/<segment:key>.ics", views.calendar_feed, name="calendar-feed"),
]
