from django.urls import path

from apps.jobs import views

app_name = "jobs"
urlpatterns = [
    path("", views.index, name="index"),
    path("new/", views.submit, name="submit"),
    path("<int:job_id>/", views.detail, name="detail"),
    path("<int:job_id>/cancel/", views.cancel, name="cancel"),
    path("cli/gpuportal.py", views.cli_download, name="cli"),
]
