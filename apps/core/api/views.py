from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.health import health_report


class HealthView(APIView):
    """Liveness and readiness: 200 when the database and the broker answer, 503 naming what is down."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_exempt = True

    @extend_schema(
        responses={
            200: inline_serializer(
                "Health",
                {
                    "status": serializers.CharField(),
                    "database": serializers.CharField(),
                    "broker": serializers.CharField(),
                },
            ),
            503: inline_serializer(
                "HealthDown",
                {
                    "status": serializers.CharField(),
                    "database": serializers.CharField(),
                    "broker": serializers.CharField(),
                    "code": serializers.CharField(),
                    "detail": serializers.CharField(),
                    "fields": serializers.DictField(),
                },
            ),
        }
    )
    def get(self, request: Request) -> Response:
        ok, report = health_report()
        if ok:
            return Response(report)
        down = [name for name in ("database", "broker") if report[name] != "ok"]
        body = {**report, "code": "unavailable", "detail": f"Down: {', '.join(down)}.", "fields": {}}
        return Response(body, status=503, headers={"Retry-After": "5"})
