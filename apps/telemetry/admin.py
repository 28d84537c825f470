from typing import TypeVar

from django.contrib import admin
from django.http import HttpRequest

from apps.telemetry.models import GpuHourlyRollup, GpuRollup, RollupFields

_R = TypeVar("_R", bound=RollupFields)

_FIGURES = ("samples", "util_min", "util_mean", "util_max", "mem_used_mean", "mem_used_max", "temp_max", "power_mean")


class RollupAdmin(admin.ModelAdmin[_R]):
    """Rollups are written by the flush tasks only: read-only here."""

    list_select_related = ("gpu", "gpu__node", "gpu__model")  # a GPU reads as node/index (model)
    search_fields = ("gpu__uuid", "gpu__node__name")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: _R | None = None) -> bool:
        return False


@admin.register(GpuRollup)
class GpuRollupAdmin(RollupAdmin[GpuRollup]):
    list_display = ("gpu", "minute", *_FIGURES)
    date_hierarchy = "minute"


@admin.register(GpuHourlyRollup)
class GpuHourlyRollupAdmin(RollupAdmin[GpuHourlyRollup]):
    list_display = ("gpu", "hour", *_FIGURES)
    date_hierarchy = "hour"
