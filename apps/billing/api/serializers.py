"""Input and output shapes of the billing API (amounts are strings: Decimal, never floats)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.billing.models import Price, UsageRecord


class UsageRecordOutput(serializers.ModelSerializer[UsageRecord]):
    team = serializers.CharField(source="team.slug")
    user = serializers.CharField(source="user.username", allow_null=True, default=None)
    gpu = serializers.CharField(source="gpu.uuid")
    gpu_model = serializers.CharField(source="gpu_model.name")
    hourly_price = serializers.DecimalField(max_digits=12, decimal_places=4)
    cost = serializers.DecimalField(max_digits=20, decimal_places=8, help_text="full precision; round to show")
    mean_utilization = serializers.DecimalField(
        max_digits=7, decimal_places=6, allow_null=True, help_text="0..1; null: no telemetry (idle cost unknown)"
    )
    idle_cost = serializers.SerializerMethodField()

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "team",
            "user",
            "gpu",
            "gpu_model",
            "source",
            "source_id",
            "start",
            "end",
            "gpu_seconds",
            "share",
            "hourly_price",
            "cost",
            "mean_utilization",
            "idle_cost",
            "end_reason",
        ]

    def get_idle_cost(self, obj: UsageRecord) -> str | None:
        from apps.billing.costing import idle_cost

        value = idle_cost(obj.cost, obj.mean_utilization)
        return None if value is None else str(value)


class ReportQueryInput(serializers.Serializer[dict[str, Any]]):
    month = serializers.CharField(required=False, help_text="YYYY-MM; default: the current month")
    team = serializers.SlugField(required=False)


class FigureOutput(serializers.Serializer[dict[str, Any]]):
    gpu_hours = serializers.CharField()
    cost = serializers.CharField(help_text="rounded to the cent")
    idle_cost = serializers.CharField(help_text="cost x (1 - utilization) over the time with telemetry")
    mean_utilization = serializers.CharField(allow_null=True, help_text="0..1, GPU-seconds weighted")
    unknown_utilization_gpu_hours = serializers.CharField(help_text="GPU-hours without telemetry")
    idle_cost_complete = serializers.BooleanField()


class ModelFigureOutput(FigureOutput):
    gpu_model = serializers.CharField()


class UserFigureOutput(FigureOutput):
    user = serializers.CharField()


class SliceFigureOutput(FigureOutput):
    gpu_model = serializers.CharField()
    slice = serializers.CharField(help_text="a MIG profile (1g.10gb) or a share (1/4 share)")
    share = serializers.CharField(help_text="of the physical GPU: 1/7 for a 1g instance, 0.25 for a quarter")


class TeamReportOutput(FigureOutput):
    team = serializers.CharField()
    name = serializers.CharField()
    by_gpu_model = ModelFigureOutput(many=True)
    by_user = UserFigureOutput(many=True)
    by_slice = SliceFigureOutput(many=True, help_text="the part of the figures above held as MIG instances or shares")


class TotalsOutput(FigureOutput):
    by_gpu_model = ModelFigureOutput(many=True)
    by_slice = SliceFigureOutput(many=True)


class MonthlyReportOutput(serializers.Serializer[dict[str, Any]]):
    month = serializers.CharField()
    currency = serializers.CharField()
    status = serializers.CharField(help_text="open | closed (frozen figures) | reopened")
    closed_at = serializers.CharField(allow_null=True)
    generated_at = serializers.CharField()
    scope = serializers.CharField(help_text="fleet (admins, no team filter) | teams")
    teams = TeamReportOutput(many=True)
    totals = TotalsOutput()


class PriceOutput(serializers.ModelSerializer[Price]):
    gpu_model = serializers.CharField(source="gpu_model.name")
    hourly_price = serializers.DecimalField(max_digits=12, decimal_places=4)
    currency = serializers.SerializerMethodField()

    class Meta:
        model = Price
        fields = ["id", "gpu_model", "valid_from", "hourly_price", "currency", "note", "created_at"]

    def get_currency(self, obj: Price) -> str:
        from django.conf import settings

        return str(settings.PORTAL_CURRENCY)


@extend_schema_field({"type": "string", "example": "2026-11-01 or 2026-11-01T00:00:00+01:00"})
class InstantField(serializers.Field[date | datetime, str, str, Any]):
    """A date (local midnight of the installation's time zone) or an ISO 8601 date-time with an offset."""

    default_error_messages = {"invalid": "Expected YYYY-MM-DD or an ISO 8601 date-time with an offset."}

    def to_internal_value(self, data: Any) -> date | datetime:
        text = str(data)
        try:
            if len(text) == 10:
                day = parse_date(text)
                if day is not None:
                    return day
            moment = parse_datetime(text)
        except ValueError:
            self.fail("invalid")
        if moment is None or moment.tzinfo is None:
            self.fail("invalid")
        return moment

    def to_representation(self, value: date | datetime) -> str:
        return value.isoformat()


class PriceInput(serializers.Serializer[dict[str, Any]]):
    gpu_model = serializers.CharField(max_length=64)
    valid_from = InstantField()
    hourly_price = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0)
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
