"""Query filters for the GPU list (GET /api/v1/gpus/: `?node=&model=&status=&uuid=`), as a django-filter FilterSet
over GPUs the user may already see."""

from __future__ import annotations

import django_filters

from apps.fleet.models import Gpu, GpuStatus


class UuidsFilter(django_filters.BaseInFilter, django_filters.CharFilter):  # type: ignore[misc]
    """`?uuid=GPU-a,GPU-b`: these GPUs only (a page watching a few GPUs of a large fleet)."""


class GpuFilterSet(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    node = django_filters.CharFilter(field_name="node__name", label="node name")
    model = django_filters.CharFilter(field_name="model__name", label="GPU model, e.g. A100-80GB")
    status = django_filters.ChoiceFilter(field_name="status", choices=GpuStatus.choices)
    uuid = UuidsFilter(field_name="uuid", label="GPU uuids, comma-separated")

    class Meta:
        model = Gpu
        fields = ["node", "model", "status", "uuid"]
