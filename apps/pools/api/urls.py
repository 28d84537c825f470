from django.urls import path

from apps.pools.api import views

urlpatterns = [
    path("pools/", views.PoolListView.as_view(), name="api-pools"),
    path("pools/<slug:name>/bridge/poll/", views.BridgePollView.as_view(), name="api-pool-bridge-poll"),
    path("pools/<slug:name>/bridge/usage/", views.BridgeUsageView.as_view(), name="api-pool-bridge-usage"),
    path(
        "pools/<slug:name>/bridge/jobs/<int:job_id>/submitted/",
        views.BridgeSubmittedView.as_view(),
        name="api-pool-bridge-submitted",
    ),
    path(
        "pools/<slug:name>/bridge/jobs/<int:job_id>/report/",
        views.BridgeReportView.as_view(),
        name="api-pool-bridge-report",
    ),
    path(
        "pools/<slug:name>/bridge/reservations/<int:reservation_id>/refused/",
        views.BridgeReservationRefusedView.as_view(),
        name="api-pool-bridge-reservation-refused",
    ),
    path(
        "pools/<slug:name>/bridge/jobs/<int:job_id>/logs/", views.BridgeLogsView.as_view(), name="api-pool-bridge-logs"
    ),
]
