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


class EfficiencyFiguresOutput(serializers.Serializer[Any]):
    allocated_gpu_hours = serializers.CharField()
    used_gpu_hours = serializers.CharField(help_text="GPU-hours weighted by mean utilization")
    idle_gpu_hours = serializers.CharField()
    idle_cost = serializers.CharField()
    reclaimed_gpu_hours = serializers.CharField()
    reclaimed_cost = serializers.CharField()


class EfficiencyUserOutput(EfficiencyFiguresOutput):
    user = serializers.CharField()


class EfficiencyWorstOutput(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["job", "reservation"])
    id = serializers.IntegerField()
    user = serializers.CharField()
    allocated_gpu_hours = serializers.CharField()
    idle_gpu_hours = serializers.CharField()
    idle_cost = serializers.CharField()
    memory_peak_mib = serializers.IntegerField(allow_null=True)
    memory_allocated_mib = serializers.IntegerField(allow_null=True)


class EfficiencyTeamOutput(EfficiencyFiguresOutput):
    team = serializers.CharField()
    name = serializers.CharField()
    by_user = EfficiencyUserOutput(many=True)
    worst = EfficiencyWorstOutput(many=True)


class EfficiencyReportOutput(serializers.Serializer[Any]):
    month = serializers.CharField()
    currency = serializers.CharField()
    teams = EfficiencyTeamOutput(many=True)
    totals = EfficiencyFiguresOutput()
