from django.urls import path

from apps.booking.api import views
from apps.core import urlconverters  # noqa: F401  # registers <segment:...>

urlpatterns = [
    path("reservations/", views.ReservationListCreateView.as_view(), name="api-reservations"),
    path("reservations/<int:pk>/", views.ReservationDetailView.as_view(), name="api-reservation-detail"),
    path("availability/", views.AvailabilityView.as_view(), name="api-availability"),
    path("booking/timeline/", views.TimelineView.as_view(), name="api-booking-timeline"),
    path("booking/quota/", views.QuotaPreviewView.as_view(), name="api-booking-quota"),
    path("gpus/<segment:uuid>/shares/", views.GpuSharesView.as_view(), name="api-gpu-shares"),
]
