"""Efficiency API shapes (documented in the OpenAPI schema)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class IdlePolicyOutput(serializers.Serializer[Any]):
    team = serializers.CharField(source="team.slug")
    enabled = serializers.BooleanField()
    warn_after_min = serializers.IntegerField()
    reclaim_after_min = serializers.IntegerField()
    utilization_below_pct = serializers.IntegerField()
    memory_below_pct = serializers.IntegerField()
    applies_to = serializers.ListField(child=serializers.ChoiceField(choices=["reservations", "jobs"]))
    unused_release_after_min = serializers.IntegerField()


class IdlePolicyInput(serializers.Serializer[Any]):
    """Every field optional (PATCH); the service validates and answers in the error shape."""

    enabled = serializers.BooleanField(required=False)
    warn_after_min = serializers.IntegerField(required=False, min_value=1)
    reclaim_after_min = serializers.IntegerField(required=False, min_value=1)
    utilization_below_pct = serializers.IntegerField(required=False, min_value=0, max_value=100)
    memory_below_pct = serializers.IntegerField(required=False, min_value=0, max_value=100)
    applies_to = serializers.ListField(child=serializers.ChoiceField(choices=["reservations", "jobs"]), required=False)
    unused_release_after_min = serializers.IntegerField(required=False, min_value=0)
