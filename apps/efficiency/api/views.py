"""Efficiency API: thin views over apps.efficiency.selectors and services."""

from __future__ import annotations

import csv
import io
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope, Team
from apps.billing.api.serializers import ReportQueryInput
from apps.billing.selectors.months import parse_month
from apps.core.api.base import PortalAPIView, ScopedListAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.efficiency import report, selectors, services, waitlist
from apps.efficiency.api.serializers import (
    EfficiencyReportOutput,
    IdlePolicyInput,
    IdlePolicyOutput,
    WaitlistInput,
    WaitlistOutput,
)
from apps.efficiency.models import WaitlistEntry


class IdlePolicyView(PortalAPIView):
    """A team's idle policy: its members and admins read it, admins change it (PATCH, partial)."""

    write_scope = Scope.ADMIN

    def _team(self, request: Request, slug: str) -> Team:
        team = Team.objects.visible_to(request.user).filter(slug=slug).first()
        if team is None:
            raise NotFound("No such team.")
        return team

    @extend_schema(responses={200: IdlePolicyOutput})
    def get(self, request: Request, slug: str) -> Response:
        return Response(IdlePolicyOutput(selectors.policy_of(self._team(request, slug))).data)

    @extend_schema(request=IdlePolicyInput, responses={200: IdlePolicyOutput})
    def patch(self, request: Request, slug: str) -> Response:
        team = self._team(request, slug)
        if not isinstance(request.data, dict):
            raise ValidationFailed("A JSON object is expected.")
        data: dict[str, Any] = dict(request.data)
        policy = services.idle_policy_update(user=request.user, team=team, data=data)
        return Response(IdlePolicyOutput(policy).data)


class EfficiencyCsvRenderer(BaseRenderer):
    """The efficiency report as CSV (`?format=csv`): teams, users, the worst items, totals."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(report.report_csv_rows(data))
        return buffer.getvalue().encode()


class EfficiencyReportView(PortalAPIView):
    """Efficiency per team and user for a month: allocated, utilization-weighted, idle and reclaimed GPU-hours, idle
    cost, the jobs and reservations that wasted most. Managers get their teams, admins every team; members 403."""

    renderer_classes = [JSONRenderer, EfficiencyCsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("month", str, description="YYYY-MM; default the current month"),
            OpenApiParameter("team", str, description="team slug"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: EfficiencyReportOutput, (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)},
    )
    def get(self, request: Request) -> Response:
        query = request.query_params
        params = ReportQueryInput(data={k: query[k] for k in ("month", "team") if k in query})
        params.is_valid(raise_exception=True)
        month = parse_month(params.validated_data.get("month"))
        team = params.validated_data.get("team") or None
        body = report.efficiency_report(user=request.user, month=month, team_slug=team)
        response = Response(body)
        if request.accepted_renderer.format == "csv":
            name = f"gpu-efficiency-{body['month']}{'-' + team if team else ''}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # Errors and OPTIONS leave as JSON in the error shape even when CSV was asked for.
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


class WaitlistView(ScopedListAPIView):
    """The waitlist entries of the user's teams (admins: all), oldest first; POST joins it (a member of the team),
    for a model, a count and a window refused for lack of GPUs (or for a slice: `mig_profile`, `gpu_share`)."""

    model = WaitlistEntry
    serializer_class = WaitlistOutput
    write_scope = Scope.RESERVATIONS_WRITE

    def base_queryset(self) -> Any:
        return WaitlistEntry.objects.select_related("team", "user", "gpu_model").order_by("created_at", "id")

    @extend_schema(request=WaitlistInput, responses={201: WaitlistOutput})
    def post(self, request: Request) -> Response:
        data = WaitlistInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        team = Team.objects.visible_to(request.user).filter(slug=v["team"]).first()
        if team is None:
            raise NotFound("No such team.")
        entry = waitlist.waitlist_join(
            user=request.user,
            team=team,
            gpu_model=v["gpu_model"],
            gpu_count=v["gpu_count"],
            start=v["start"],
            end=v["end"],
            auto_book=v["auto_book"],
            note=v["note"],
            mig_profile=v["mig_profile"],
            gpu_share=v["gpu_share"],
        )
        return Response(WaitlistOutput(entry).data, status=201)


class WaitlistEntryView(PortalAPIView):
    """Leave the waitlist (the member who joined, the team's managers, admins)."""

    write_scope = Scope.RESERVATIONS_WRITE

    @extend_schema(responses={200: WaitlistOutput})
    def delete(self, request: Request, entry_id: int) -> Response:
        entry = waitlist.waitlist_cancel(user=request.user, entry_id=entry_id)
        return Response(WaitlistOutput(entry).data)
