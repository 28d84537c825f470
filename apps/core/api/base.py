"""Base API views. Every list/detail view takes its rows from `Model.objects.visible_to(user)`, so team
scoping is applied once, here, and a view cannot forget it (tests/test_permission_matrix.py checks)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from rest_framework import generics
from rest_framework.views import APIView


class PortalAPIView(APIView):
    """Plain API view; subclasses declare `write_scope` for unsafe methods."""


class ScopedQuerysetMixin:
    model: ClassVar[type[models.Model]]
    request: Any

    def base_queryset(self) -> models.QuerySet[Any]:
        """Override to add select_related/annotations; scoping is applied on top."""
        return self.model._default_manager.all()

    def get_queryset(self) -> models.QuerySet[Any]:
        qs = self.base_queryset()
        scoped: models.QuerySet[Any] = qs.visible_to(self.request.user)  # type: ignore[attr-defined]
        return scoped


class ScopedListAPIView(ScopedQuerysetMixin, generics.ListAPIView[Any]):
    pass


class ScopedRetrieveAPIView(ScopedQuerysetMixin, generics.RetrieveAPIView[Any]):
    pass
