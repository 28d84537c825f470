from django.urls import path

from apps.billing.api import views

urlpatterns = [
    path("usage/", views.UsageListView.as_view(), name="api-usage"),
    path("reports/monthly/", views.MonthlyReportView.as_view(), name="api-report-monthly"),
    path("prices/", views.PriceListCreateView.as_view(), name="api-prices"),
]
