"""Query filters of the reservation list (`GET /api/v1/reservations/?team=&gpu=&model=&status=&early=&from=&to=`).

django-filter ships no type information: its classes are `Any` to mypy, hence the ignores on the subclasses."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import F, Q, QuerySet

from apps.booking.models import Allocation, Reservation, ReservationStatus


class StatusesField(forms.CharField):
    """Comma-separated reservation statuses, e.g. `cancelled,released`."""

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        statuses = [s.strip() for s in str(super().to_python(value)).split(",") if s.strip()]
        unknown = sorted(set(statuses) - set(ReservationStatus.values))
        if unknown:
            # As a parameter: django-filter %-formats the message, and a '%' in the query must not break it.
            raise forms.ValidationError("Unknown status: %(statuses)s.", params={"statuses": ", ".join(unknown)})
        return statuses


class StatusesFilter(django_filters.Filter):  # type: ignore[misc]
    field_class = StatusesField

    def filter(self, qs: QuerySet[Any], value: list[str]) -> QuerySet[Any]:
        return qs.filter(status__in=value) if value else qs


class StrictBooleanField(forms.CharField):
    """`true` or `false` (1 or 0): anything else is a 400, where django's NullBooleanField would ignore it."""

    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]
        text = str(super().to_python(value)).strip().lower()
        if not text:
            return None
        if text not in ("true", "false", "1", "0"):
            raise forms.ValidationError("true or false.")
        return text in ("true", "1")


class StrictBooleanFilter(django_filters.Filter):  # type: ignore[misc]
    field_class = StrictBooleanField


class SlugFilter(django_filters.CharFilter):  # type: ignore[misc]
    field_class = forms.SlugField


class ReservationFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    """Narrow reservations by team slug, GPU uuid, model name, statuses and a window (those overlapping
    [from, to)). Scoping is the view's (`visible_to`)."""

    team = SlugFilter(field_name="team__slug", help_text="team slug")
    gpu = django_filters.CharFilter(method="filter_gpu", max_length=96, help_text="GPU uuid")
    model = django_filters.CharFilter(method="filter_model", max_length=64, help_text="GPU model name")
    status = StatusesFilter(help_text="comma-separated: booked,active,released,cancelled")
    early = StrictBooleanFilter(
        method="filter_early", help_text="true: only those ended before their booked end (cancelled or released early)"
    )

    class Meta:
        model = Reservation
        fields: list[str] = []

    def filter_gpu(self, qs: QuerySet[Reservation], name: str, value: str) -> QuerySet[Reservation]:
        return qs.filter(pk__in=Allocation.objects.filter(gpu__uuid=value).values("reservation_id"))

    def filter_early(self, qs: QuerySet[Reservation], name: str, value: bool) -> QuerySet[Reservation]:
        # A reservation that runs to its end is released too (by the tick, at its booked end): the end tells them apart.
        early = Q(status=ReservationStatus.CANCELLED) | Q(
            status=ReservationStatus.RELEASED, ended_at__lt=F("booked_end")
        )
        return qs.filter(early) if value else qs.exclude(early)

    def filter_model(self, qs: QuerySet[Reservation], name: str, value: str) -> QuerySet[Reservation]:
        booked_by_model = Q(gpu_model__name=value)
        holding_one = Q(pk__in=Allocation.objects.filter(gpu__model__name=value).values("reservation_id"))
        return qs.filter(booked_by_model | holding_one)


# The query's names "from" and "to" cannot be attribute names ("from" is a Python keyword).
ReservationFilterSet.base_filters.update(
    {
        "from": django_filters.IsoDateTimeFilter(
            field_name="end", lookup_expr="gt", help_text="only reservations ending after this time (ISO 8601)"
        ),
        "to": django_filters.IsoDateTimeFilter(
            field_name="start", lookup_expr="lt", help_text="only reservations starting before this time (ISO 8601)"
        ),
    }
)
