from django.urls import path

from apps.efficiency.api import views

urlpatterns = [
    path("teams/<slug:slug>/idle-policy/", views.IdlePolicyView.as_view(), name="api-idle-policy"),
    path("reports/efficiency/", views.EfficiencyReportView.as_view(), name="api-report-efficiency"),
]
