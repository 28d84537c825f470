from django.urls import path, register_converter

from apps.billing import views


class MonthConverter:
    regex = r"\d{4}-\d{2}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(MonthConverter, "month")

app_name = "billing"
urlpatterns = [
    path("", views.index, name="index"),
    path("teams/<slug:slug>/", views.team_page, name="team"),
    path("report/<month:month>.pdf", views.fleet_pdf, name="report-pdf"),
    path("report/<month:month>/<slug:slug>.pdf", views.team_pdf, name="team-pdf"),
]
