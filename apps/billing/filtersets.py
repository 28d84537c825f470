"""Query filters for billing's lists, as django-filter FilterSets over rows the user may already see: ledger rows
(GET /api/v1/usage/: `?team=&month=&source=&source_id=&gpu_model=`) and prices (GET /api/v1/prices/:
`?gpu_model=`)."""

from __future__ import annotations

from datetime import date
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_field

from apps.accounts.models import Team
from apps.billing.models import Price, SourceKind, UsageRecord
from apps.billing.selectors.months import parse_month
from apps.core.errors import NotFound, ValidationFailed


class MonthField(forms.Field):
    """`YYYY-MM` in the installation's time zone, as the month's first day; no future month."""

    def to_python(self, value: Any) -> date | None:
        if value in self.empty_values:
            return None
        try:
            return parse_month(str(value))
        except ValidationFailed as exc:
            # As a parameter: django-filter %-formats the message, and a '%' in the query must not break it.
            raise forms.ValidationError("%(detail)s", params={"detail": exc.detail}) from None


# A string in the schema, not the date the model's field holds.
@extend_schema_field({"type": "string", "description": "YYYY-MM in the installation's time zone"})
class MonthFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    field_class = MonthField


class SlugFilter(django_filters.CharFilter):  # type: ignore[misc]
    field_class = forms.SlugField


class IdFilter(django_filters.NumberFilter):  # type: ignore[misc]
    field_class = forms.IntegerField


class UsageFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    """Filters over the ledger rows a user may see (the queryset given is already scoped). A team the user
    cannot see is 404, as on every other team-scoped route; malformed values are 400."""

    team = SlugFilter(method="filter_team", label="team slug")
    month = MonthFilter(field_name="month")
    source = django_filters.ChoiceFilter(field_name="source", choices=SourceKind.choices)
    source_id = IdFilter(field_name="source_id", min_value=1, label="the job's or reservation's id")
    gpu_model = django_filters.CharFilter(field_name="gpu_model__name", max_length=64, label="GPU model name")

    class Meta:
        model = UsageRecord
        fields = ["team", "month", "source", "source_id", "gpu_model"]

    def filter_team(self, queryset: QuerySet[UsageRecord], name: str, value: str) -> QuerySet[UsageRecord]:
        team = Team.objects.visible_to(self.request.user).filter(slug=value).first()
        if team is None:
            raise NotFound(f"No team {value!r} that you belong to.")
        return queryset.filter(team=team)


class PriceFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    gpu_model = django_filters.CharFilter(field_name="gpu_model__name", label="GPU model name")

    class Meta:
        model = Price
        fields = ["gpu_model"]
