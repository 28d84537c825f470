"""Admin: quotas, the booking policy and maintenance windows are edited here; reservations and allocations
are read-only (they change only through services, which keep the quota and the occupancy table consistent)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from apps.booking import selectors
from apps.booking.models import Allocation, BookingPolicy, MaintenanceWindow, Quota, QuotaUsage, Reservation

_M = TypeVar("_M", bound=models.Model)


class ReadOnlyAdmin(admin.ModelAdmin[_M]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return False


class AllocationInline(admin.TabularInline[Allocation, Reservation]):
    model = Allocation
    extra = 0
    fields = ("gpu", "start", "end", "active", "ended_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Reservation | None = None) -> bool:
        return False


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin[Reservation]):
    list_display = ("id", "team", "user", "gpu_model", "gpu_count", "start", "end", "status")
    # Named: Django's automatic select_related follows only the non-null keys, and user and model may be null.
    list_select_related = ("team", "user", "gpu_model")
    list_filter = ("status", "team", "gpu_model")
    search_fields = ("team__slug", "user__username", "note")
    date_hierarchy = "start"
    inlines = [AllocationInline]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin[Allocation]):
    list_display = ("id", "gpu", "team", "kind", "reservation", "job_id", "start", "end", "active")
    # What each row's labels read: the GPU's node and model, the reservation's team and model.
    list_select_related = ("gpu__node", "gpu__model", "team", "reservation__team", "reservation__gpu_model")
    list_filter = ("kind", "active", "team")
    search_fields = ("gpu__uuid", "team__slug")
    date_hierarchy = "start"


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin[Quota]):
    list_display = ("team", "month", "gpu_hours", "max_concurrent_gpus", "budget_soft", "budget_hard")
    list_filter = ("team",)
    filter_horizontal = ("allowed_models",)


@admin.register(QuotaUsage)
class QuotaUsageAdmin(ReadOnlyAdmin[QuotaUsage]):
    list_display = ("team", "month", "slot", "gpu_hours", "cost", "updated_at")
    list_filter = ("team",)


@admin.register(BookingPolicy)
class BookingPolicyAdmin(admin.ModelAdmin[BookingPolicy]):
    list_display = ("__str__", "granularity_minutes", "min_duration_minutes", "max_duration_hours", "max_advance_days")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not BookingPolicy.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: BookingPolicy | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: BookingPolicy, form: Any, change: bool) -> None:
        obj.pk = 1
        super().save_model(request, obj, form, change)
        selectors.policy_cache_clear()


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin[MaintenanceWindow]):
    list_display = ("start", "end", "node", "gpu", "reason")
    list_select_related = ("node", "gpu__node", "gpu__model")
    list_filter = ("node",)
    date_hierarchy = "start"
