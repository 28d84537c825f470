from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope
from apps.accounts.types import signed_in
from apps.core.api.base import PortalAPIView
from apps.core.errors import NotFound
from apps.events import selectors, services
from apps.events.api.serializers import (
    DeliveryOutput,
    MailPreferenceSerializer,
    WebhookCreatedOutput,
    WebhookInput,
    WebhookOutput,
)
from apps.events.models import WebhookDelivery, WebhookEndpoint


class WebhookListCreateView(generics.ListAPIView[WebhookEndpoint]):
    """Webhook endpoints of the teams you manage (admins: all). The signing secret is returned once."""

    write_scope = Scope.WEBHOOKS_WRITE
    serializer_class = WebhookOutput

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        return selectors.webhooks_visible_to(user=self.request.user)

    @extend_schema(request=WebhookInput, responses={201: WebhookCreatedOutput})
    def post(self, request: Request) -> Response:
        payload = WebhookInput(data=request.data)
        payload.is_valid(raise_exception=True)
        endpoint, secret = services.webhook_create(
            user=signed_in(request.user),
            team_slug=payload.validated_data["team"],
            url=payload.validated_data["url"],
            events=payload.validated_data["events"],
        )
        return Response(WebhookCreatedOutput(endpoint, context={"secret": secret}).data, status=status.HTTP_201_CREATED)


class WebhookDetailView(PortalAPIView):
    write_scope = Scope.WEBHOOKS_WRITE

    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: int) -> Response:
        services.webhook_delete(user=signed_in(request.user), endpoint_id=endpoint_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateSecretView(PortalAPIView):
    """A new signing secret, returned once; the old one stops at once."""

    write_scope = Scope.WEBHOOKS_WRITE

    @extend_schema(request=None, responses={200: WebhookCreatedOutput})
    def post(self, request: Request, endpoint_id: int) -> Response:
        endpoint, secret = services.webhook_rotate_secret(user=signed_in(request.user), endpoint_id=endpoint_id)
        return Response(WebhookCreatedOutput(endpoint, context={"secret": secret}).data)


class WebhookDeliveriesView(generics.ListAPIView[WebhookDelivery]):
    """An endpoint's delivery log, newest first: status, attempts, response code and time."""

    serializer_class = DeliveryOutput

    def get_queryset(self) -> QuerySet[WebhookDelivery]:
        if getattr(self, "swagger_fake_view", False):  # the schema generator asks without a request's user
            return WebhookDelivery.objects.none()
        endpoint = selectors.webhook_get(user=self.request.user, endpoint_id=int(self.kwargs["endpoint_id"]))
        if endpoint is None:
            raise NotFound("No such webhook.")
        return selectors.deliveries_of(endpoint=endpoint)


class MailPreferenceView(PortalAPIView):
    """Your mail preferences: which events reach you by mail."""

    # Your own preferences: a browser session or any token that can read may change them.
    required_scopes = {"PATCH": Scope.READ}

    @extend_schema(responses=MailPreferenceSerializer)
    def get(self, request: Request) -> Response:
        return Response(MailPreferenceSerializer(selectors.mail_preference_of(user=signed_in(request.user))).data)

    @extend_schema(request=MailPreferenceSerializer, responses=MailPreferenceSerializer)
    def patch(self, request: Request) -> Response:
        payload = MailPreferenceSerializer(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        preference = services.mail_preference_update(user=signed_in(request.user), changes=dict(payload.validated_data))
        return Response(MailPreferenceSerializer(preference).data)
