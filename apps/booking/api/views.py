"""Booking API: thin views over apps.booking.services and selectors."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope, Team
from apps.accounts.types import AnyUser
from apps.booking import selectors, services
from apps.booking.api.inputs import reservation_input_fast
from apps.booking.api.serializers import (
    AvailabilityOutput,
    GpuSharesInput,
    GpuSharesOutput,
    QuotaPreviewInput,
    QuotaPreviewOutput,
    ReservationChangeInput,
    ReservationCreatedOutput,
    ReservationInput,
    ReservationOutput,
    TimelineOutput,
    WindowInput,
    booking_created_payload,
)
from apps.booking.filtersets import ReservationFilterSet
from apps.booking.models import Reservation
from apps.booking.services.devices import check_profile, parse_share
from apps.core.api.base import PortalAPIView, ScopedListAPIView, ScopedRetrieveAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.core.idempotency import idempotent
from apps.fleet.models import GpuModel


def _team_by_slug(slug: str, user: AnyUser) -> Team:
    team = selectors.team_for_booking(slug=slug, user=user)
    if team is None:
        raise NotFound(f"No team {slug!r}.", fields={"team": ["Unknown team."]})
    return team


def _model_by_name(name: str | None) -> GpuModel | None:
    if not name:
        return None
    model = GpuModel.objects.filter(name=name).first()
    if model is None:
        raise ValidationFailed(f"Unknown GPU model {name!r}.", fields={"model": ["Unknown GPU model."]})
    return model


_FILTERS = [
    OpenApiParameter("team", str, description="team slug"),
    OpenApiParameter("gpu", str, description="GPU uuid"),
    OpenApiParameter("model", str, description="GPU model name"),
    OpenApiParameter("status", str, description="comma-separated statuses"),
    OpenApiParameter("early", bool, description="true: only those ended before their booked end; false: all others"),
    OpenApiParameter("from", str, description="only reservations ending after this time (ISO 8601)"),
    OpenApiParameter("to", str, description="only reservations starting before this time (ISO 8601)"),
]


class ReservationListCreateView(ScopedListAPIView):
    """Reservations of your teams (admins: all), filterable; POST books GPUs (honours Idempotency-Key)."""

    model = Reservation
    serializer_class = ReservationOutput
    write_scope = Scope.RESERVATIONS_WRITE

    def base_queryset(self) -> QuerySet[Any]:
        filters = ReservationFilterSet(self.request.query_params, queryset=Reservation.objects.all())
        if not filters.is_valid():
            raise drf_exceptions.ValidationError({name: list(errors) for name, errors in filters.errors.items()})
        return selectors.reservations_with_details(filters.qs)

    @extend_schema(parameters=_FILTERS, responses=ReservationOutput(many=True))
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(request=ReservationInput, responses={201: ReservationCreatedOutput})
    @idempotent
    def post(self, request: Request) -> Response:
        data = reservation_input_fast(request)
        if data is None:
            payload = ReservationInput(data=request.data)
            payload.is_valid(raise_exception=True)
            data = payload.validated_data
        result = services.reservation_create(
            user=request.user,
            team=_team_by_slug(data["team"], request.user),
            start=data["start"],
            end=data["end"],
            gpu_count=data.get("gpu_count"),
            gpu_model=data.get("gpu_model") or None,
            gpus=data.get("gpus") or None,
            note=data.get("note", ""),
            mig_profile=data.get("mig_profile") or None,
            gpu_share=data.get("gpu_share"),
            mig_memory_mib=data.get("mig_memory_mib"),
        )
        return Response(booking_created_payload(result), status=status.HTTP_201_CREATED)


class ReservationDetailView(ScopedRetrieveAPIView):
    """One reservation. PATCH moves its end (extend, or end it earlier); DELETE cancels it before its start, or
    releases it early after (GPUs free at once)."""

    model = Reservation
    serializer_class = ReservationOutput
    required_scopes = {"DELETE": Scope.RESERVATIONS_WRITE, "PATCH": Scope.RESERVATIONS_WRITE}

    def base_queryset(self) -> QuerySet[Any]:
        return selectors.reservations_with_details(Reservation.objects.all())

    @extend_schema(request=ReservationChangeInput, responses={200: ReservationCreatedOutput})
    def patch(self, request: Request, pk: int) -> Response:
        if not selectors.reservations_visible_to(user=request.user).filter(pk=pk).exists():
            raise NotFound("No such reservation.")  # before the body: an outsider learns nothing from a 400
        payload = ReservationChangeInput(data=request.data)
        payload.is_valid(raise_exception=True)
        changed = services.reservation_change_end(
            user=request.user, reservation_id=pk, end=payload.validated_data["end"]
        )
        reservation = selectors.reservations_visible_to(user=request.user).get(pk=pk)
        return Response(ReservationCreatedOutput(reservation, context={"warnings": changed.warnings}).data)

    @extend_schema(responses={200: ReservationOutput})
    def delete(self, request: Request, pk: int) -> Response:
        services.reservation_end(user=request.user, reservation_id=pk)
        reservation = selectors.reservations_visible_to(user=request.user).get(pk=pk)
        return Response(ReservationOutput(reservation).data)


class AvailabilityView(PortalAPIView):
    """Free and total bookable GPUs in [start, end), per model and per node."""

    @extend_schema(parameters=[WindowInput], responses=AvailabilityOutput)
    def get(self, request: Request) -> Response:
        payload = WindowInput(data=request.query_params)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        body = selectors.gpu_availability(start=data["start"], end=data["end"], model=_model_by_name(data.get("model")))
        return Response(body)


class TimelineView(PortalAPIView):
    """GPUs and who holds them in [start, end): your teams' slots in detail, other teams' by team name only."""

    @extend_schema(parameters=[WindowInput], responses=TimelineOutput)
    def get(self, request: Request) -> Response:
        payload = WindowInput(data=request.query_params)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        return Response(selectors.timeline(user=request.user, start=data["start"], end=data["end"]))


class QuotaPreviewView(PortalAPIView):
    """A team's quota per month with what is booked and left; with start, end, gpu_count (and gpu_model), what
    such a booking would count and whether it fits."""

    @extend_schema(parameters=[QuotaPreviewInput], responses=QuotaPreviewOutput)
    def get(self, request: Request) -> Response:
        payload = QuotaPreviewInput(data=request.query_params)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        team = Team.objects.visible_to(request.user).filter(slug=data["team"]).first()
        if team is None:
            raise NotFound(f"No team {data['team']!r}.")
        profile = data.get("mig_profile") or ""
        share = parse_share(data["gpu_share"]) if data.get("gpu_share") is not None else None
        if profile:
            check_profile(profile)
        gpus: Decimal | int | None = data.get("gpu_count")
        if profile or share is not None:  # a part counts its fraction of a GPU, as the booking will
            gpus = services.quota_gpus(gpu_count=int(gpus or 1), mig_profile=profile, gpu_share=share)
        return Response(
            selectors.quota_preview(
                team=team,
                start=data.get("start"),
                end=data.get("end"),
                gpu_count=gpus,
                gpu_model=_model_by_name(data.get("gpu_model")),
            )
        )


class GpuSharesView(PortalAPIView):
    """Split a GPU in N equal shares, or make it exclusive again with 1 (admin). 409 while the GPU or a share of it
    is held now or later; 400 for a count out of range or a GPU in MIG mode (its instances are its parts)."""

    write_scope = Scope.ADMIN

    @extend_schema(request=GpuSharesInput, responses=GpuSharesOutput)
    def post(self, request: Request, uuid: str) -> Response:
        payload = GpuSharesInput(data=request.data)
        payload.is_valid(raise_exception=True)
        gpu, parts = services.gpu_shares_change(
            actor=request.user, gpu_uuid=uuid, shares=payload.validated_data["shares"]
        )
        body = {"gpu": gpu.uuid, "node": gpu.node.name, "shares": gpu.shares, "share_devices": parts}
        return Response(GpuSharesOutput(body).data)
