"""Query filters for job lists (the API's `?state=&team=&user=` and the jobs page), as django-filter FilterSets."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms

from apps.jobs.models import Job, JobState


class StatesField(forms.Field):
    """One state or several separated by commas, each one of JobState's values."""

    def to_python(self, value: Any) -> list[str] | None:
        if not value:
            return None
        states = [s.strip() for s in str(value).split(",") if s.strip()]
        unknown = [s for s in states if s not in JobState.values]
        if unknown:
            # The value goes in as a parameter: django-filter %-formats the message, and a '%' typed into the
            # query string would otherwise break that formatting (a 500 instead of this 400).
            raise forms.ValidationError(
                "Unknown state %(state)r; one of %(states)s.",
                params={"state": unknown[0], "states": ", ".join(JobState.values)},
            )
        return states or None


class StatesFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    field_class = StatesField


class JobFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    """Filters over the jobs a user may see (the queryset given is already scoped)."""

    state = StatesFilter(field_name="state", lookup_expr="in", label="state, or several separated by commas")
    team = django_filters.CharFilter(field_name="team__slug", label="team slug")
    user = django_filters.CharFilter(field_name="user__username", label="username of the submitter")

    class Meta:
        model = Job
        fields = ["state", "team", "user"]
