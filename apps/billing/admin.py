"""Admin for billing: prices (added through the service, never edited), the ledger (read-only), month closes
(re-open / close again through the services, audited), budget alerts and notifications."""

from __future__ import annotations

from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from apps.billing import services
from apps.billing.models import (
    BudgetAlert,
    MigProfilePrice,
    MonthClose,
    MonthStatus,
    Notification,
    Price,
    UsageRecord,
)
from apps.core.errors import ApplicationError

_M = TypeVar("_M", bound=Model)


class _ReadOnly(admin.ModelAdmin[_M]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PriceForm(forms.ModelForm[Price]):
    class Meta:
        model = Price
        fields = ["gpu_model", "valid_from", "hourly_price", "note"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("gpu_model") and data.get("valid_from") and data.get("hourly_price") is not None:
            try:
                services.price_validate(
                    gpu_model=data["gpu_model"], valid_from=data["valid_from"], hourly_price=data["hourly_price"]
                )
            except ApplicationError as exc:
                raise forms.ValidationError(exc.detail) from exc
        return data


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin[Price]):
    """A new price applies from its date; the ledger of the open month is re-rated; closed months are refused."""

    form = PriceForm
    list_display = ("gpu_model", "valid_from", "hourly_price", "note", "created_by", "created_at")
    list_select_related = ("gpu_model", "created_by")
    list_filter = ("gpu_model",)
    ordering = ("gpu_model__name", "-valid_from")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None  # history is never edited: add a new price instead

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        saved = services.price_set(
            actor=request.user,
            gpu_model=obj.gpu_model,
            hourly_price=obj.hourly_price,
            valid_from=obj.valid_from,
            note=obj.note,
        )
        obj.pk = saved.pk


@admin.register(MigProfilePrice)
class MigProfilePriceAdmin(admin.ModelAdmin[MigProfilePrice]):
    """Prices of MIG instances by profile; without one, an instance bills at its GPU's price x g/7."""

    list_display = ["gpu_model", "profile", "hourly_price"]
    list_select_related = ["gpu_model"]


@admin.register(UsageRecord)
class UsageRecordAdmin(_ReadOnly[UsageRecord]):
    list_display = (
        "start",
        "end",
        "team",
        "user",
        "gpu",
        "source",
        "source_id",
        "gpu_seconds",
        "cost",
        "mean_utilization",
        "end_reason",
    )
    list_filter = ("month", "team", "source", "gpu_model", "end_reason")
    search_fields = ("source_id", "user__username", "team__slug")
    date_hierarchy = "start"
    list_select_related = ("team", "user", "gpu__node", "gpu__model")


@admin.register(MonthClose)
class MonthCloseAdmin(_ReadOnly[MonthClose]):
    list_display = ("month", "status", "cost", "gpu_seconds", "closed_at", "closed_by", "reopened_at", "reopened_by")
    list_select_related = ("closed_by", "reopened_by")
    readonly_fields = [f.name for f in MonthClose._meta.fields]
    actions = ["reopen_months", "close_months"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_staff)  # the actions; every field is read-only

    @admin.action(description="Re-open the selected months (audited)")
    def reopen_months(self, request: HttpRequest, queryset: QuerySet[MonthClose]) -> None:
        for closing in queryset.filter(status=MonthStatus.CLOSED):
            try:
                services.month_reopen(month=closing.month, actor=request.user, reason="admin action")
                self.message_user(request, f"{closing.month:%Y-%m} re-opened.")
            except ApplicationError as exc:
                self.message_user(request, exc.detail, level=messages.ERROR)

    @admin.action(description="Close the selected months again (freeze their figures)")
    def close_months(self, request: HttpRequest, queryset: QuerySet[MonthClose]) -> None:
        for closing in queryset.filter(status=MonthStatus.REOPENED):
            try:
                services.month_close(month=closing.month, actor=request.user)
                self.message_user(request, f"{closing.month:%Y-%m} closed.")
            except ApplicationError as exc:
                self.message_user(request, exc.detail, level=messages.ERROR)


@admin.register(BudgetAlert)
class BudgetAlertAdmin(_ReadOnly[BudgetAlert]):
    list_display = ("team", "month", "threshold", "budget", "cost", "created_at")
    list_select_related = ("team",)
    list_filter = ("month", "threshold")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin[Notification]):
    list_display = ("created_at", "team", "level", "title")
    list_select_related = ("team",)
    list_filter = ("level", "team")
    search_fields = ("title", "body")
