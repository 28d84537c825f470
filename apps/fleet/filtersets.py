"""Query filters for the GPU list (GET /api/v1/gpus/: `?node=&model=&status=`), as a django-filter FilterSet over
GPUs the user may already see."""

from __future__ import annotations

import django_filters

from apps.fleet.models import Gpu, GpuStatus


class GpuFilterSet(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    node = django_filters.CharFilter(field_name="node__name", label="node name")
    model = django_filters.CharFilter(field_name="model__name", label="GPU model, e.g. A100-80GB")
    status = django_filters.ChoiceFilter(field_name="status", choices=GpuStatus.choices)

    class Meta:
        model = Gpu
        fields = ["node", "model", "status"]
