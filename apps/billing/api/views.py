"""Billing API: thin views over apps.billing.selectors and services."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.billing import selectors, services
from apps.billing.api.serializers import (
    MonthlyReportOutput,
    PriceInput,
    PriceOutput,
    ReportQueryInput,
    UsageRecordOutput,
)
from apps.billing.filtersets import PriceFilterSet, UsageFilterSet
from apps.billing.models import Price, UsageRecord
from apps.core.api.base import PortalAPIView, ScopedListAPIView
from apps.core.errors import ValidationFailed
from apps.core.idempotency import idempotent
from apps.fleet.models import GpuModel


class UsageListView(ScopedListAPIView):
    """Ledger rows: admins see every team's, managers their teams', members their own. Filters: team, month
    (YYYY-MM), source (job | reservation), source_id, gpu_model."""

    model = UsageRecord
    serializer_class = UsageRecordOutput
    filter_backends = [DjangoFilterBackend]
    filterset_class = UsageFilterSet

    def base_queryset(self) -> QuerySet[Any]:
        return selectors.usage_records()


class CsvRenderer(BaseRenderer):
    """The monthly report as CSV (`?format=csv`): the same figures as the JSON, one row per team, per team and
    GPU model, per team and user, and the totals."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows(selectors.report_csv_rows(data))
        return buffer.getvalue().encode()


class MonthlyReportView(PortalAPIView):
    """Monthly report per team: GPU-hours, cost, idle cost, mean utilization, by GPU model and by user, and totals.
    Managers get their teams, admins every team; members are refused (403). `format=csv` for CSV. A closed
    month's figures are the frozen ones."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("month", str, description="YYYY-MM; default the current month"),
            OpenApiParameter("team", str, description="team slug"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: MonthlyReportOutput, (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)},
    )
    def get(self, request: Request) -> Response:
        query = request.query_params
        params = ReportQueryInput(data={k: query[k] for k in ("month", "team") if k in query})
        params.is_valid(raise_exception=True)
        month = selectors.parse_month(params.validated_data.get("month"))
        team = params.validated_data.get("team") or None
        report = selectors.monthly_report(user=request.user, month=month, team_slug=team)
        response = Response(report)
        if request.accepted_renderer.format == "csv":
            name = f"gpu-report-{report['month']}{'-' + team if team else ''}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # Only a report is CSV: errors and OPTIONS metadata asked for with format=csv leave as JSON in the error
        # shape (the CSV renderer would otherwise be handed a body that is not a report).
        if request.method != "GET" or getattr(response, "status_code", 200) >= 300:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        wanted = request.query_params.get("format")
        if wanted and wanted not in {"json", "csv"}:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
            raise ValidationFailed("format must be json or csv.", fields={"format": ["json or csv."]})
        return super().perform_content_negotiation(request, force)


class PriceListCreateView(ScopedListAPIView):
    """Price history of every GPU model (`gpu_model` filter). POST (admins) sets a price from a date on; a date
    that would change a closed month is refused (400 `month_closed`)."""

    model = Price
    serializer_class = PriceOutput
    filter_backends = [DjangoFilterBackend]
    filterset_class = PriceFilterSet

    def base_queryset(self) -> QuerySet[Any]:
        return Price.objects.select_related("gpu_model").order_by("gpu_model__name", "valid_from")

    @extend_schema(request=PriceInput, responses={201: PriceOutput})
    @idempotent
    def post(self, request: Request) -> Response:
        payload = PriceInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        gpu_model = GpuModel.objects.filter(name=data["gpu_model"]).first()
        if gpu_model is None:
            raise ValidationFailed("Unknown GPU model.", fields={"gpu_model": ["Unknown GPU model."]})
        price = services.price_set(
            actor=request.user,
            gpu_model=gpu_model,
            hourly_price=data["hourly_price"],
            valid_from=data["valid_from"],
            note=data["note"],
        )
        return Response(PriceOutput(price).data, status=status.HTTP_201_CREATED)
