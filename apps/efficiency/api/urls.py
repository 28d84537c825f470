from django.urls import path

from apps.efficiency.api import views

urlpatterns = [
    path("teams/<slug:slug>/idle-policy/", views.IdlePolicyView.as_view(), name="api-idle-policy"),
    path("waitlist/", views.WaitlistView.as_view(), name="api-waitlist"),
    path("waitlist/<int:entry_id>/", views.WaitlistEntryView.as_view(), name="api-waitlist-entry"),
    path("reports/efficiency/", views.EfficiencyReportView.as_view(), name="api-report-efficiency"),
]
