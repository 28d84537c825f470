from django.urls import path

from apps.jobs.api import views

urlpatterns = [
    path("images/", views.ImageListView.as_view(), name="api-images"),
    path("jobs/", views.JobListCreateView.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="api-job-detail"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/logs/", views.JobLogsView.as_view(), name="api-job-logs"),
]
